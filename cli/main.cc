// The `idem` command: the front end with no tools of its own registered
// (HTTP tools arrive with the server). Programs that embed idem call
// idem::cli::RunCli with their own registry; see examples/travel_booking.

#include "cli/cli.h"

int main(int argc, char** argv) {
  idem::cli::FrontendConfig config;
  return idem::cli::RunCli(argc, argv, config);
}
