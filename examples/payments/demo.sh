#!/usr/bin/env bash
# The payments demo (issue 19), run by `make demo` after the travel trip:
# authorize a hold, approve by policy, capture (or void) it, on the embedded
# store, then the providers' ledger and its checker.
#   1. a small amount: passes by policy, captured at once;
#   2. a medium amount: waits for one finance approver, approved;
#   3. a large amount: waits for two; rejected, and the hold is voided.
# Usage: examples/payments/demo.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$ROOT/$BUILD/examples/payments"
[ -d "$BIN" ] || BIN="$BUILD/examples/payments"
PAY="$BIN/payments"
CHECK="$BIN/payments-ledger"
EX="$ROOT/examples/payments"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-payments.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
DB="$WORK/pay.db"
LEDGER="$DB.ledger.sqlite"

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
say() { printf '\n$ %s\n' "$*"; }
token() {
  "$PAY" --db "$DB" approvals --json |
    sed -n 's/^ *"token": "\(.*\)",\{0,1\}$/\1/p' | head -n 1
}

SPEC="$EX/payment.json"

# Who decides under the policy: the people of an auth file (the file
# `payments serve --auth` would read), each proving it with a credential
# file of their own; a name and a role on the command line count for
# nothing toward the policy.
umask 077
AUTH="$WORK/auth.json"
newtoken() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
MARIA=$(newtoken)
OLGA=$(newtoken)
printf '%s' "$MARIA" >"$WORK/maria.token"
printf '%s' "$OLGA" >"$WORK/olga.token"
cat >"$AUTH" <<EOF
[{"name": "maria", "token_sha256": "$(sha "$MARIA")", "roles": ["approver", "finance"]},
 {"name": "olga", "token_sha256": "$(sha "$OLGA")", "roles": ["approver", "finance"]}]
EOF

bold "== Payments 1. EUR 45.00: the policy passes it, the hold is captured at once =="
say "payments --db pay.db run payment.json --input @input_small.json --intent-key ord-small"
"$PAY" --db "$DB" run "$SPEC" --input "@$EX/input_small.json" --intent-key ord-small
rc=$?
echo "(exit $rc)"
if [ $rc -eq 7 ]; then
  echo "(the policy should have passed this amount)"; exit 1
fi

bold "== Payments 2. EUR 1,200.00: one finance approver =="
say "payments --db pay.db run payment.json --input @input_medium.json --intent-key ord-medium"
"$PAY" --db "$DB" run "$SPEC" --input "@$EX/input_medium.json" --intent-key ord-medium
echo "(exit $?: 7 = the hold is placed; the capture waits for a person)"
say "payments --db pay.db approvals"
"$PAY" --db "$DB" approvals
say "payments --db pay.db approve \$TOKEN --auth auth.json --credential @maria.token --note 'invoice 2026-118'"
"$PAY" --db "$DB" approve "$(token)" --auth "$AUTH" --credential "@$WORK/maria.token" --note "invoice 2026-118"
echo "(exit $?: captured, receipt sent)"

bold "== Payments 3. EUR 9,000.00: needs two; rejected, the hold is voided =="
say "payments --db pay.db run payment.json --input @input_large.json --intent-key ord-large"
"$PAY" --db "$DB" run "$SPEC" --input "@$EX/input_large.json" --intent-key ord-large
echo "(exit $?)"
say "payments --db pay.db approve \$TOKEN --auth auth.json --credential @maria.token --note 'looks right'"
"$PAY" --db "$DB" approve "$(token)" --auth "$AUTH" --credential "@$WORK/maria.token" --note "looks right"
echo "(exit $?: one of two finance approvals; the capture still waits)"
say "IDEM_CREDENTIAL=\$OLGA payments --db pay.db reject \$TOKEN --auth auth.json --reason 'no purchase order'"
IDEM_CREDENTIAL="$OLGA" "$PAY" --db "$DB" reject "$(token)" --auth "$AUTH" --reason "no purchase order"
echo "(exit $?: 3 = rolled back: the hold is voided, nothing captured)"

say "payments-ledger --ledger pay.db.ledger.sqlite show"
"$CHECK" --ledger "$LEDGER" show
say "payments-ledger --ledger pay.db.ledger.sqlite check"
"$CHECK" --ledger "$LEDGER" check || exit 1
