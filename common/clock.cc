#include "common/clock.h"

#include <thread>

namespace idem {

SystemClock* SystemClock::Get() {
  static SystemClock clock;
  return &clock;
}

int64_t SystemClock::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SystemClock::SleepMs(int64_t ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace idem
