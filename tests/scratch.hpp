#pragma once
// Scratch things tests of processes and sockets share: a directory removed at the end of its
// scope, a capture of what this process writes to stderr, an environment variable for a scope.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace collx_test {

/// A scratch directory for a file store, removed at the end of the scope.
struct temp_dir {
  std::string path;
  temp_dir() {
    char t[] = "/tmp/collx-test-XXXXXX";
    path = mkdtemp(t);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

/// Captures what this process writes to stderr (fd 2) while alive.
struct stderr_capture {
  int saved = dup(2);
  std::string path = "/tmp/collx-stderr-" + std::to_string(getpid());
  stderr_capture() {
    const int f = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(f, 2);
    close(f);
  }
  std::string text() const {
    std::ifstream i(path);
    return std::string((std::istreambuf_iterator<char>(i)), std::istreambuf_iterator<char>());
  }
  ~stderr_capture() {
    dup2(saved, 2);
    close(saved);
    std::remove(path.c_str());
  }
};

/// Sets an environment variable for the scope (then unsets it).
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const char* v) : name(std::move(n)) { ::setenv(name.c_str(), v, 1); }
  scoped_env(std::string n, const std::string& v) : scoped_env(std::move(n), v.c_str()) {}
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

}  // namespace collx_test
