# idem: the two commands a fresh Debian 12 machine needs are `make demo` and
# `make test`; both install dependencies and build first.
JOBS ?= 2
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=

.PHONY: all deps build build-asan demo demo-server test test-fast test-asan clean format bench \
	bench-peers http-attack http-attack-server chaos

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

$(ASAN_BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON $(CMAKE_FLAGS)

build-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The travel demo on the embedded store: happy path, rollback, crash + recover;
# then the payments demo (authorize, approve by policy, capture or void).
demo: build
	@bash scripts/demo.sh $(BUILD)
	@bash examples/payments/demo.sh $(BUILD)

# The same trip through `idem serve` with curl, the providers over HTTP.
demo-server: build
	@bash scripts/demo-server.sh $(BUILD)

# Every test, on the release build and on the ASan+UBSan build.
test: build build-asan
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --output-on-failure -j$(JOBS)

# The release build's tests only (quicker while developing).
test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The benchmarks (docs/bench.md): a table of figures beside their anchors and
# bench/out/results.json. BENCH_QUICK=1 for a short check that they run.
bench: build
	@bash bench/run.sh $(BUILD)

# idem beside DBOS Transact and Restate (docs/bench.md, "The peer engines"):
# interleaved rounds, the table in bench/out/peers/results.txt. BENCH_QUICK=1
# for one short round (about a minute).
bench-peers: build
	@bash bench/peers/run.sh $(BUILD)

# The attacks of issue 12 at full size against the http/ front (about a
# minute): /healthz latency and RSS after each (tests/http_attack.cc).
http-attack: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS) --target http_attack
	$(BUILD)/tests/http_attack

# The same attacks at full size against a real `idem serve` (its RSS).
http-attack-server: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS) --target http_attack idem
	@bash scripts/http-attack-server.sh $(BUILD)

# The chaos sweep at full size (docs/reliability.md): random SIGKILLs of every
# idem process, provider faults, PostgreSQL restarts, then the ledger checker.
# CHAOS_SEED=N replays a seed; CHAOS_SAGAS and CHAOS_PG_RESTARTS resize it.
CHAOS_SEED ?= 0
CHAOS_SAGAS ?= 650
CHAOS_PG_RESTARTS ?= 12
CHAOS_MIN_KILLS ?= 1000
chaos: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS) --target idem-chaos travel-booking
	$(BUILD)/chaos/idem-chaos sweep --store both --seed $(CHAOS_SEED) --sagas $(CHAOS_SAGAS) \
	  --pg-restarts $(CHAOS_PG_RESTARTS) --min-kills $(CHAOS_MIN_KILLS)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
