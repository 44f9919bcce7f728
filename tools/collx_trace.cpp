// collx-trace: reads every rank's flight-recorder dump of a job (collx-rank<R>.json, written into
// COLLX_DUMP_DIR on a failed call, on collx::flight::dump, or on SIGUSR2) and says what happened:
// which ranks are behind, which call mismatched, who waited on whom, and per communicator the
// straggler table. The analysis is tools/trace.hpp; docs/diagnostics.md shows a report.
//
//   collx-trace [DIR | FILE ...]     (default: $COLLX_DUMP_DIR, else the current directory)
//
// Exit status: 0 when the dumps were read, 2 when none could be (no dump found, or one that is
// not a collx dump).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "trace.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args)
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: collx-trace [DIR | FILE ...]\n"
          "  reads collx-rank<R>.json dumps (from DIR, default $COLLX_DUMP_DIR or .) and reports where each rank\n"
          "  is, the first mismatched call, who waits on whom, and each communicator's straggler table\n");
      return 0;
    }
  if (args.empty()) {
    const char* d = std::getenv("COLLX_DUMP_DIR");
    args.push_back(d != nullptr && *d != '\0' ? d : ".");
  }
  std::vector<std::string> files;
  namespace fs = std::filesystem;
  for (const std::string& a : args) {
    std::error_code ec;
    if (fs::is_directory(a, ec)) {
      for (const auto& e : fs::directory_iterator(a, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("collx-rank", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json") files.push_back(e.path().string());
      }
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "collx-trace: no collx-rank<R>.json in %s\n", args.front().c_str());
    return 2;
  }
  std::vector<collx_trace::rank_dump> dumps;
  try {
    for (const std::string& f : files) dumps.push_back(collx_trace::read_dump(f));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collx-trace: %s\n", e.what());
    return 2;
  }
  std::fputs(collx_trace::report(collx_trace::assemble(std::move(dumps))).c_str(), stdout);
  return 0;
}
