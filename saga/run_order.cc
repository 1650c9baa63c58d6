// SagaRun::CompletionOrder: the order in which a saga's steps completed, read
// from the journal (saga/run.h).

#include "saga/run.h"

namespace idem {

Result<std::vector<int>> SagaRun::CompletionOrder() const {
  std::vector<int> order;
  if (!spec_.parallel) return order;  // one after another: the spec's order
  auto journal = store_->ReadJournal(rec_.summary.saga_id);
  if (!journal.ok()) return journal.status();
  std::vector<bool> seen(rec_.steps.size(), false);
  auto visit = [&](const storage::JournalEntry& e) {
    const bool completed =
        e.event == "succeeded" || (e.event == "operator_resolved" && e.data.is_object() &&
                                   e.data.value("decision", std::string()) == "applied");
    if (!completed || e.step_id.empty()) return;
    for (size_t i = 0; i < rec_.steps.size(); ++i) {
      if (rec_.steps[i].step_id == e.step_id && !seen[i]) {
        seen[i] = true;
        order.push_back(static_cast<int>(i));
      }
    }
  };
  for (const storage::JournalEntry& e : *journal) visit(e);
  for (const storage::JournalEntry& e : staged_.journal) visit(e);  // not yet durable
  return order;
}

}  // namespace idem
