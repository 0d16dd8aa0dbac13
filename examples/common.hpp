// SPDX-License-Identifier: Apache-2.0
// Shared by the examples: their command line, read strictly (example::Args, example::main), and
// mesh sizes.
//
// A command line is flags with one value each, `--name value` or `--name=value`. Every value is
// checked whole and against its range, a flag may come once, and a flag the program does not know
// is an error that names the nearest known one: a misspelt `--recipie zero2` must not train the
// default recipe. Bad input is one line on stderr, `<program>: <message>`, and exit status 2
// (`usage_status`), apart from 1, a check or run that failed; `--help` prints the usage, status 0.
//
// The whole command line is checked before the runtime starts, so that nothing (threads, MPI,
// Kokkos) starts for a typo and Kokkos 3's own reading of unprefixed flags (`--device`,
// `--threads`, `--help`) never sees one. The runtime's flags (`--backend`, `--devices`,
// `--threads-per-device`, `--simulate-device`, which Runtime::from_args takes out of argv, their
// values checked there) and Kokkos's (`--kokkos-...`, one word each, for Kokkos::initialize) are passed on untouched.
#pragma once

#include <shardlib/runtime/runtime.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace example {

/// The exit status of bad command-line input (a usage error); 1 stays a check or run that failed.
inline constexpr int usage_status = 2;

/// Bad command-line input: `example::main` prints it as `<program>: <message>` and exits with
/// `usage_status`.
class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Edits (insert, delete or replace a character, or swap two neighbours) from `a` to `b`: the
/// optimal string alignment distance, by which an unknown flag's nearest known one is found.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);  // two neighbours swapped
    }
  return d[a.size()][b.size()];
}

/// An example's command line, read strictly (see the file comment). Each flag is asked for once,
/// with its default and what it accepts; a bad value is remembered and reported by `finish()`,
/// which also refuses every flag nobody asked for. Use the values only after `finish()` (or
/// `runtime()`, which calls it). A value that starts with '-' and a letter reads as a flag:
/// `--png=-x.png` gives it.
/// ```
/// example::Args args(argc, argv, "gpt");
/// const auto layers = args.integer("--layers", 2, 1, 65536);
/// const auto recipe = args.choice("--recipe", "dp", {"dp", "zero1", "tp"});
/// auto rt = args.runtime(/*default_devices=*/4);  // finish(), then Runtime::from_args
/// ```
class Args {
 public:
  /// The runtime's flags: Runtime::from_args takes them (and their values) out of argv.
  static constexpr std::array<std::string_view, 4> runtime_flags = {"--backend", "--devices", "--threads-per-device",
                                                                     "--simulate-device"};
  /// Kokkos's flags start so; Kokkos::initialize takes them out of argv.
  static constexpr std::string_view kokkos_prefix = "--kokkos-";

  /// Reads argv (not changed: the runtime takes its flags out of it later).
  Args(int& argc, char** argv, std::string program) : argc_(argc), argv_(argv), program_(std::move(program)) {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
      } else if (a.starts_with(kokkos_prefix)) {
        // Kokkos's, one word each (--kokkos-threads=4): Kokkos::initialize reads it
      } else if (!is_flag(a)) {
        const std::string_view before = i > 1 ? std::string_view(argv[i - 1]) : std::string_view();
        error(i, 0, "unexpected argument '" + std::string(a) + "'" +
                        (before.starts_with(kokkos_prefix) && before.find('=') == std::string_view::npos
                             ? " (Kokkos's flags take their value after '=': " + std::string(before) + "=" +
                                   std::string(a) + ")"
                             : " (flags come as --name value)"));
      } else if (const std::size_t eq = a.find('='); eq != std::string_view::npos) {
        given_.push_back({std::string(a.substr(0, eq)), std::string(a.substr(eq + 1)), i});
      } else if (i + 1 < argc && !is_flag(argv[i + 1])) {
        given_.push_back({std::string(a), std::string(argv[i + 1]), i});
        ++i;
      } else {
        given_.push_back({std::string(a), std::nullopt, i});
      }
    }
    for (std::string_view f : runtime_flags)
      if (const Given* g = take(f)) given_value(*g);  // their values: Runtime::from_args checks them
  }

  const std::string& program() const noexcept { return program_; }
  /// Whether `--help` (or `-h`) was given.
  bool help() const noexcept { return help_; }

  /// A whole number from `min` to `max` (decimal, all of the value: not "12x", "abc" or "").
  long long integer(std::string_view flag, long long fallback, long long min, long long max) {
    const Given* g = take(flag);
    if (!g) return fallback;
    const std::optional<std::string> v = given_value(*g);
    if (!v) return fallback;
    long long x = 0;
    const char* end = v->data() + v->size();
    const auto [at, ec] = std::from_chars(v->data(), end, x);
    if (v->empty() || ec != std::errc() || at != end || x < min || x > max) {
      error(g->position, 1, std::string(flag) + " must be a whole number from " + std::to_string(min) + " to " +
                                std::to_string(max) + ", got '" + *v + "'");
      return fallback;
    }
    return x;
  }

  /// A switch: 0 or 1, nothing else.
  bool boolean(std::string_view flag, bool fallback = false) {
    const Given* g = take(flag);
    if (!g) return fallback;
    const std::optional<std::string> v = given_value(*g);
    if (!v) return fallback;
    if (*v != "0" && *v != "1") {
      error(g->position, 1, std::string(flag) + " must be 0 or 1, got '" + *v + "'");
      return fallback;
    }
    return *v == "1";
  }

  /// One of `choices`.
  std::string choice(std::string_view flag, std::string fallback, std::initializer_list<std::string_view> choices) {
    const Given* g = take(flag);
    if (!g) return fallback;
    const std::optional<std::string> v = given_value(*g);
    if (!v) return fallback;
    if (std::find(choices.begin(), choices.end(), std::string_view(*v)) != choices.end()) return *v;
    std::string list;
    for (std::string_view c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
    error(g->position, 1, "unknown " + std::string(flag) + " '" + *v + "' (" + list + ")");
    return fallback;
  }

  /// A finite number in [min, max].
  double real(std::string_view flag, double fallback, double min, double max) {
    const Given* g = take(flag);
    if (!g) return fallback;
    const std::optional<std::string> v = given_value(*g);
    if (!v) return fallback;
    double x = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
    if (ec != std::errc() || end != v->data() + v->size() || !(x >= min && x <= max)) {
      error(g->position, 1, std::string(flag) + " must be a number from " + std::to_string(min) + " to " +
                                std::to_string(max) + ", got '" + *v + "'");
      return fallback;
    }
    return x;
  }

  /// Any text but an empty one (a file or directory name).
  std::string text(std::string_view flag, std::string fallback) {
    const Given* g = take(flag);
    if (!g) return fallback;
    const std::optional<std::string> v = given_value(*g);
    if (!v) return fallback;
    if (v->empty()) {
      error(g->position, 1, std::string(flag) + " must not be empty");
      return fallback;
    }
    return *v;
  }

  /// Throws the command line's first error (UsageError): a flag nobody asked for (with the nearest
  /// known flag) or an unexpected argument first, else the first bad or missing value or repeated
  /// flag, in the order of the command line. Call it once every flag has been asked for.
  void finish() {
    finished_ = true;
    for (const Given& g : given_) {
      if (std::find(known_.begin(), known_.end(), g.name) != known_.end()) continue;
      std::string message = "unknown flag '" + g.name + "'";
      if (const std::string near = nearest(g.name); !near.empty())
        message += "; did you mean '" + near + "'?";
      else
        message += " (" + program_ + " --help lists the flags)";
      error(g.position, 0, message);
    }
    if (!errors_.empty()) throw UsageError(std::min_element(errors_.begin(), errors_.end())->message);
  }

  /// A usage error found after reading the flags (sizes that do not fit together): throws it.
  [[noreturn]] void fail(const std::string& message) const { throw UsageError(message); }

  /// `finish()`, then the runtime (Runtime::from_args), which takes its flags out of argv; its
  /// refusals of theirs (a bad --devices or --backend, or SHARDLIB_DEVICES) are usage errors too.
  shardlib::Runtime runtime(int default_devices) {
    if (!finished_) finish();
    try {
      return shardlib::Runtime::from_args(argc_, argv_, default_devices);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }

 private:
  struct Given {
    std::string name;
    std::optional<std::string> value;  // none: the flag ends the line, or another flag follows
    int position;
  };
  struct Error {
    int rank;  // 0: an unknown flag or unexpected argument; 1: a bad value
    int position;
    std::string message;
    bool operator<(const Error& o) const { return std::pair(rank, position) < std::pair(o.rank, o.position); }
  };

  /// A flag: `--name`, or `-name` (a misspelling of one, reported as unknown); not `-2`, a value.
  static bool is_flag(std::string_view a) {
    return a.size() >= 2 && a[0] == '-' && (a[1] == '-' || !(a[1] >= '0' && a[1] <= '9'));
  }

  /// The occurrence of `flag`, if given (noting that the program knows it); a second one is an error.
  const Given* take(std::string_view flag) {
    if (finished_) throw std::logic_error("example::Args: " + std::string(flag) + " asked for after finish()");
    known_.emplace_back(flag);
    const Given* first = nullptr;
    for (const Given& g : given_) {
      if (g.name != flag) continue;
      if (!first)
        first = &g;
      else
        error(g.position, 1, std::string(flag) + " given twice");
    }
    return first;
  }

  std::optional<std::string> given_value(const Given& g) {
    if (!g.value) error(g.position, 1, g.name + " needs a value");
    return g.value;
  }

  /// The known flag nearest `name`, if near enough to be a misspelling of it (a third of its
  /// letters edited at most, or two); "" otherwise.
  std::string nearest(const std::string& name) const {
    std::vector<std::string> candidates = known_;
    candidates.emplace_back("--help");
    std::string best;
    std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
    for (const std::string& k : candidates)
      if (const std::size_t d = edit_distance(name, k); d < best_distance) best = k, best_distance = d;
    return best;
  }

  void error(int position, int rank, std::string message) { errors_.push_back({rank, position, std::move(message)}); }

  int& argc_;
  char** argv_;
  std::string program_;
  bool help_ = false;
  bool finished_ = false;
  std::vector<Given> given_;
  std::vector<std::string> known_;
  std::vector<Error> errors_;
};

/// An example's main: `body(args)` reads the flags, starts the runtime (`args.runtime(...)`) and
/// returns the exit status. `--help` prints `usage` (status 0) without running it; a UsageError
/// prints `<program>: <message>` (status 2), any other exception `<program>: <what>` (status 1).
template <class Body>
int main(int& argc, char** argv, const char* program, const char* usage, Body&& body) {
  try {
    Args args(argc, argv, program);
    if (args.help()) {
      std::fputs(usage, stdout);
      return 0;
    }
    return body(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return usage_status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

/// Two mesh sizes whose product is `devices`, as square as they come (8 -> {4, 2}, 6 -> {3, 2}).
inline std::array<int, 2> square_mesh(int devices) {
  int b = 1;
  for (int d = 1; d * d <= devices; ++d)
    if (devices % d == 0) b = d;
  return {devices / b, b};
}

}  // namespace example
