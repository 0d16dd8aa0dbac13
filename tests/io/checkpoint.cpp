// SPDX-License-Identifier: Apache-2.0
// Distributed checkpoints: round trips across meshes, specs, shapes and element types (saved on
// one mesh, loaded on another, compared with the one-device values), reads into host memory,
// what the file holds, bytes read once, bad input, corruption, interrupted and failed saves.
// The bodies run on threads devices and under mpirun; the fault tests that fork or change
// process limits run on threads only.
#include <doctest/doctest.h>
#include <shardlib/io.hpp>
#include <shardlib/pipeline.hpp>

#include "../collectives/harness.hpp"

#include <hdf5.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace sl = shardlib;
namespace fs = std::filesystem;
using sl::none;

namespace {
using M2 = sl::Mesh<"x", "y">;
using M1 = sl::Mesh<"d">;
template <class S, class T = float, class M = M2>
using Tensor = sl::DistributedTensor<T, M, S>;
using Rows = sl::Spec<"x", none>;
using Cols = sl::Spec<none, "y">;
using Rep = sl::Spec<none, none>;
using Grid = sl::Spec<"x", "y">;
using GridT = sl::Spec<"y", "x">;
using Both = sl::Spec<sl::axes<"x", "y">, none>;
using PSum = sl::Spec<none, "x", sl::partial_sum<"y">>;
using D0 = sl::Spec<"d", none>;
using D1 = sl::Spec<none, "d">;

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}
// Another mesh of the same devices: {2, n/2} when n is even, else {1, n}.
M2 other_mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {2, n / 2}) : M2(ctx, {1, n});
}

// A fresh directory, the same on every device of the run (device 0 makes it), removed at the end.
struct SharedDir {
  sl::Context& ctx;
  std::string path;
  explicit SharedDir(sl::Context& c) : ctx(c) {
    std::vector<unsigned char> bytes(256, 0);
    if (ctx.device() == 0) {
      std::string tmpl = (fs::temp_directory_path() / "shardlib_io_XXXXXX").string();
      REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
      std::copy(tmpl.begin(), tmpl.end(), bytes.begin());
    }
    ctx.world().broadcast(bytes.data(), bytes.size(), sl::coll::DType::u8, 0);
    path = reinterpret_cast<const char*>(bytes.data());
  }
  ~SharedDir() {
    ctx.world().barrier();
    if (ctx.device() == 0) fs::remove_all(path);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// The global values of test tensors: a function of the global index, so every mesh agrees.
template <class T>
T value_at(std::int64_t k, int salt) {
  if constexpr (sl::is_floating_v<T>) return static_cast<T>(static_cast<float>(k) * 0.25f + static_cast<float>(salt));
  else return static_cast<T>((k * 7 + salt) % 120);
}
template <class T>
std::vector<T> values(std::int64_t n, int salt) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) v[static_cast<std::size_t>(k)] = value_at<T>(k, salt);
  return v;
}
template <class S, class T, class M>
Tensor<S, T, M> make(const M& mesh, std::array<std::int64_t, 2> shape, int salt) {
  return Tensor<S, T, M>::from_host(mesh, shape, values<T>(shape[0] * shape[1], salt));
}

// All devices' sum of a counter.
std::uint64_t total(sl::Context& ctx, std::uint64_t mine) {
  std::uint64_t all = 0;
  ctx.world().all_reduce(&mine, &all, 1, sl::coll::DType::u64, sl::coll::Op::sum);
  return all;
}

// Saves a T tensor of `shape` with spec S on mesh_of, then loads it with every other spec, on
// both meshes, and as a host array; all must equal the one-device values.
template <class T, class S>
void round_trip(sl::Context& ctx, const SharedDir& dir, std::array<std::int64_t, 2> shape) {
  const M2 mesh = mesh_of(ctx), other = other_mesh_of(ctx);
  M1 line(ctx, {ctx.num_devices()});
  const int salt = static_cast<int>(shape[0] * 3 + shape[1]);
  const auto want = values<T>(shape[0] * shape[1], salt);
  const std::string file = dir / "rt.h5";
  auto src = make<S, T>(mesh, shape, salt);
  sl::io::save(file, {{"t", src}});
  CAPTURE(S::value.to_string());
  CAPTURE(shape[0]);
  CAPTURE(shape[1]);
  auto check = [&](const auto& t) {
    CAPTURE(std::remove_cvref_t<decltype(t)>::spec_string());
    CHECK(t.to_host() == want);
  };
  check(sl::io::load<Tensor<Rows, T>>(other, file, "t"));
  check(sl::io::load<Tensor<Cols, T>>(other, file, "t"));
  check(sl::io::load<Tensor<Rep, T>>(mesh, file, "t"));
  check(sl::io::load<Tensor<GridT, T>>(mesh, file, "t"));
  check(sl::io::load<Tensor<Both, T>>(other, file, "t"));
  check(sl::io::load<Tensor<D0, T, M1>>(line, file, "t"));
  check(sl::io::load<Tensor<D1, T, M1>>(line, file, "t"));
  auto host = sl::io::read<T>(file, "t");
  CHECK(host.shape == std::vector<std::int64_t>{shape[0], shape[1]});
  CHECK(host.data == want);
}
}  // namespace

TEST_SUITE("io") {
TEST_CASE("save on one mesh and spec, load onto others: the one-device values, any element type and shape") {
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    std::mt19937 rng(42);  // the same shapes on every device
    for (int trial = 0; trial < 8; ++trial) {
      std::array<std::int64_t, 2> shape{static_cast<std::int64_t>(rng() % 13), static_cast<std::int64_t>(1 + rng() % 11)};
      if (trial == 0) shape = {0, 5};  // empty
      switch (trial % 8) {
        case 6: round_trip<sl::bf16, Rows>(ctx, dir, shape); break;
        case 7: round_trip<sl::f16, Grid>(ctx, dir, shape); break;
        case 0: round_trip<float, Grid>(ctx, dir, shape); break;
        case 1: round_trip<double, Rows>(ctx, dir, shape); break;
        case 2: round_trip<std::int32_t, Both>(ctx, dir, shape); break;
        case 3: round_trip<std::int64_t, Rep>(ctx, dir, shape); break;
        case 4: round_trip<std::int8_t, GridT>(ctx, dir, shape); break;
        default: round_trip<std::uint16_t, Cols>(ctx, dir, shape); break;
      }
    }
  });
}

TEST_CASE("blocks written and read in many slabs (each checksummed as it goes) round-trip and are checked") {
  const auto old = sl::io::detail::slab_bytes();
  sl::io::detail::slab_bytes() = 64;  // a few rows per slab (set before the devices start)
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    round_trip<float, Rows>(ctx, dir, {37, 5});
    round_trip<double, Grid>(ctx, dir, {29, 3});
  }, {1, 3, 4});
  sl::io::detail::slab_bytes() = old;
}

TEST_CASE("a checkpoint from one device count loads onto another (threads runtimes of 8, 3, 4 and 1 devices)") {
  if (sl::test::mpi_runtime()) return;  // needs runtimes of several sizes in one process
  const std::string file = (fs::temp_directory_path() / ("shardlib_io_counts_" + std::to_string(::getpid()) + ".h5")).string();
  const auto want = values<float>(30 * 17, 1);
  sl::Runtime::threads(8).spmd([&](sl::Context& ctx) {
    M2 mesh(ctx, {4, 2});
    auto w = make<Grid, float>(mesh, {30, 17}, 1);
    auto b = make<Rows, double>(mesh, {5, 3}, 2);
    auto c = sl::DistributedTensor<std::int64_t, M2, sl::Spec<"x", none, "y">>::iota(mesh, {5, 3, 7});
    sl::io::save(file, {{"layer0/w", w}, {"layer0/b", b}, {"cube", c}});
  });
  for (int n : {3, 4, 1}) {
    sl::Runtime::threads(n).spmd([&](sl::Context& ctx) {
      const M2 mesh = mesh_of(ctx);
      auto w = Tensor<GridT>::zeros(mesh, {30, 17});
      auto b = Tensor<Rep, double>::zeros(mesh, {5, 3});
      auto c = sl::DistributedTensor<std::int64_t, M2, sl::Spec<none, sl::axes<"y", "x">, none>>::zeros(mesh, {5, 3, 7});
      sl::io::load(file, {{"layer0/w", w}, {"layer0/b", b}, {"cube", c}});
      CHECK(w.to_host() == want);
      CHECK(b.to_host() == values<double>(15, 2));
      std::vector<std::int64_t> iota(105);
      std::iota(iota.begin(), iota.end(), std::int64_t{0});
      CHECK(c.to_host() == iota);
    });
  }
  auto info = sl::io::list(file);
  REQUIRE(info.size() == 3);
  CHECK(info[0].name == "cube");
  CHECK(info[0].shape == std::vector<std::int64_t>{5, 3, 7});
  info.erase(info.begin());
  CHECK(info[0].name == "layer0/b");
  CHECK(info[0].dtype == sl::coll::DType::f64);
  CHECK(info[0].spec == "Spec<\"x\", none>");
  CHECK(info[1].name == "layer0/w");
  CHECK(info[1].shape == std::vector<std::int64_t>{30, 17});
  CHECK(info[1].mesh == "{x: 4, y: 2}");
  fs::remove(file);
}

TEST_CASE("scalars (rank 0) and vectors round-trip") {
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    const M2 mesh = mesh_of(ctx);
    auto s = sl::DistributedTensor<double, M2, sl::Spec<>>::full(mesh, {}, 2.5);
    auto v = sl::DistributedTensor<std::int32_t, M2, sl::Spec<sl::axes<"x", "y">>>::iota(mesh, {11});
    sl::io::save(dir / "sv.h5", {{"scalar", s}, {"vector", v}});
    auto s2 = sl::io::load<sl::DistributedTensor<double, M1, sl::Spec<>>>(M1(ctx, {ctx.num_devices()}), dir / "sv.h5", "scalar");
    auto v2 = sl::io::load<sl::DistributedTensor<std::int32_t, M1, sl::Spec<none>>>(M1(ctx, {ctx.num_devices()}), dir / "sv.h5", "vector");
    CHECK(s2.to_host() == std::vector<double>{2.5});
    std::vector<std::int32_t> iota(11);
    std::iota(iota.begin(), iota.end(), 0);
    CHECK(v2.to_host() == iota);
    const auto host = sl::io::read<double>(dir / "sv.h5", "scalar");
    CHECK(host.shape.empty());
    CHECK(host.data == std::vector<double>{2.5});
  }, {1, 2, 4});
}

TEST_CASE("a load reads each byte once; replicas get theirs by broadcast; partial targets hold the value") {
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    const M2 mesh = mesh_of(ctx);
    auto src = make<Grid, float>(mesh, {13, 6}, 3);
    const auto want = values<float>(13 * 6, 3);
    sl::io::save(dir / "a.h5", {{"a", src}});
    sl::io::Stats& st = sl::io::stats(ctx);
    const std::uint64_t before = st.bytes_read;
    auto rep = sl::io::load<Tensor<Rep>>(mesh, dir / "a.h5", "a");
    CHECK(total(ctx, st.bytes_read - before) == 13 * 6 * sizeof(float));
    CHECK(rep.to_host() == want);
    const std::uint64_t before2 = st.bytes_read;
    auto p = sl::io::load<Tensor<PSum>>(mesh, dir / "a.h5", "a");
    CHECK(total(ctx, st.bytes_read - before2) == 13 * 6 * sizeof(float));
    CHECK(p.to_host() == want);
    // Saving wrote each byte once too: replicas write nothing.
    const std::uint64_t w0 = st.bytes_written;
    sl::io::save(dir / "b.h5", {{"rep", rep}});
    CHECK(total(ctx, st.bytes_written - w0) == 13 * 6 * sizeof(float));
  });
}

TEST_CASE("tensors some devices hold (a pipeline stage's) are saved from them and loaded into them, or onto every device") {
  using MS = sl::Mesh<"s", "d">;
  using Split = sl::Spec<"d", none>;
  using SplitT = sl::Spec<none, "d">;
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    const int n = ctx.num_devices();
    const int stages = n % 2 == 0 ? 2 : n;
    const MS mesh(ctx, {stages, n / stages});
    const int me = mesh.shape().coords(ctx.device())[0];
    sl::pipeline::StageScope<"s"> scope(mesh);  // each stage's tensors have their own shapes
    auto name_of = [](int s) { return "stage" + std::to_string(s) + "/w"; };
    auto shape_of = [](int s) { return std::array<std::int64_t, 2>{4 + s, 3}; };
    const std::string file = dir / "pp.h5";
    // Each stage saves its own tensor, and every device the shared one.
    auto mine = make<Split, float>(mesh, shape_of(me), me);
    auto shared = make<SplitT, float>(mesh, {2, 6}, 50);
    sl::io::Stats& st = sl::io::stats(ctx);
    const std::uint64_t w0 = st.bytes_written;
    sl::io::save(file, {{"shared", shared}, {name_of(me), mine}});
    std::uint64_t want_bytes = 2 * 6 * sizeof(float);
    for (int s = 0; s < stages; ++s) want_bytes += static_cast<std::uint64_t>(shape_of(s)[0] * shape_of(s)[1]) * sizeof(float);
    CHECK(total(ctx, st.bytes_written - w0) == want_bytes);  // each block once
    CHECK(sl::io::list(file).size() == static_cast<std::size_t>(stages + 1));
    for (int s = 0; s < stages; ++s) {
      const auto sh = shape_of(s);
      CHECK(sl::io::read<float>(file, name_of(s)).data == values<float>(sh[0] * sh[1], s));
      // Onto every device, in another spec (a run without stages resuming from a pipelined one).
      CHECK(sl::io::load<Tensor<Rep, float, MS>>(mesh, file, name_of(s)).to_host() == values<float>(sh[0] * sh[1], s));
    }
    // Back into each stage, in another spec, with the shared tensor in the same call.
    auto back = Tensor<SplitT, float, MS>::zeros(mesh, shape_of(me));
    auto shared_back = Tensor<Rep, float, MS>::zeros(mesh, {2, 6});
    const std::uint64_t r0 = st.bytes_read;
    sl::io::load(file, {{name_of(me), back}, {"shared", shared_back}});
    CHECK(total(ctx, st.bytes_read - r0) == want_bytes);  // a stage's tensor: each of its devices its block; shared: once
    CHECK(shared_back.to_host() == values<float>(12, 50));
    const auto whole = sl::reshard<Rep>(back);  // (over "d": within the stage)
    const auto sh = shape_of(me);
    CHECK(std::vector<float>(whole.local().data(), whole.local().data() + sh[0] * sh[1]) == values<float>(sh[0] * sh[1], me));

    // Bad input, thrown alike on every device, the previous checkpoint intact: one name with two
    // shapes on two stages; a tensor whose holders do not cover it.
    if (stages > 1) {
      auto w = make<Split, float>(mesh, shape_of(me), me);
      CHECK_THROWS_WITH_AS(sl::io::save(file, {{"w", w}}),
                           doctest::Contains(("tensor 'w' is f32 [4, 3] Spec<\"d\", none> on {s: " + std::to_string(stages) +
                                              ", d: " + std::to_string(n / stages) + "} on device 0 but f32 [5, 3]")
                                                 .c_str()),
                           std::invalid_argument);
    }
    if (n > 1) {
      M1 line(ctx, {n});
      auto part = Tensor<D0, float, M1>::zeros(line, {2 * n, 3});
      std::vector<sl::io::Entry> list{{"shared", shared}};
      if (ctx.device() == 0) list.emplace_back("part", part);
      CHECK_THROWS_WITH_AS(sl::io::save(file, list),
                           doctest::Contains(("tensor 'part' ([" + std::to_string(2 * n) +
                                              ", 3] Spec<\"d\", none> on {d: " + std::to_string(n) +
                                              "}) is held by device(s) 0, whose blocks cover 6 of its " + std::to_string(6 * n) +
                                              " elements")
                                                 .c_str()),
                           std::invalid_argument);
    }
    CHECK(sl::io::read<float>(file, "shared").data == values<float>(12, 50));
  });
}

TEST_CASE("io::in_place loads into the tensor's own block: every view of it sees the values") {
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    const M2 mesh = mesh_of(ctx);
    auto src = make<Grid, float>(mesh, {6, 4}, 7);
    sl::io::save(dir / "v.h5", {{"v", src}, {"u", src}});
    auto a = Tensor<Rows>::zeros(mesh, {6, 4}), b = Tensor<Rows>::zeros(mesh, {6, 4});
    const auto view_a = a, view_b = b;  // (share the blocks, as an optimizer's copy of a Param does)
    sl::io::load(dir / "v.h5", {{"v", a}});
    sl::io::load(dir / "v.h5", {{"v", b, sl::io::in_place}});
    const auto want = values<float>(24, 7);
    CHECK(a.to_host() == want);
    CHECK(view_a.to_host() == std::vector<float>(24, 0.f));  // a has a new block; its old view does not see it
    CHECK(b.to_host() == want);
    CHECK(view_b.to_host() == want);
    // A failed in-place load changes nothing.
    auto wrong = Tensor<Rows>::zeros(mesh, {4, 6});
    CHECK_THROWS_AS(sl::io::load(dir / "v.h5", {{"v", b, sl::io::in_place}, {"u", wrong}}), std::invalid_argument);
    CHECK(view_b.to_host() == want);
  });
}

TEST_CASE("bad input: clear errors, the same on every device, and the tensors unchanged") {
  sl::test::for_each_run([](sl::Context& ctx) {
    SharedDir dir(ctx);
    const M2 mesh = mesh_of(ctx);
    auto a = make<Grid, float>(mesh, {6, 4}, 0);
    const std::string file = dir / "ck.h5";
    sl::io::save(file, {{"a", a}, {"g/b", a}});
    auto x = Tensor<Rows>::full(mesh, {6, 4}, 9.0f);
    const auto nines = std::vector<float>(24, 9.0f);
    // Missing file, missing name, wrong shape, wrong element type: x keeps its values.
    CHECK_THROWS_WITH_AS(sl::io::load(dir / "nope.h5", {{"a", x}}), doctest::Contains("No such file or directory"),
                         sl::io::Error);
    CHECK_THROWS_WITH_AS(sl::io::load(file, {{"a", x}, {"c", x}}),
                         doctest::Contains("has no tensor 'c' (it has: a, g/b)"), sl::io::Error);
    CHECK_THROWS_WITH_AS(sl::io::load(file, {{"g", x}}), doctest::Contains("has no tensor 'g'"), sl::io::Error);
    auto wrong = Tensor<Rows>::full(mesh, {4, 6}, 1.0f);
    CHECK_THROWS_WITH_AS(sl::io::load(file, {{"a", x}, {"g/b", wrong}}),
                         "shardlib::io::load: tensor 'g/b' has shape [6, 4] in the checkpoint but the tensor to load "
                         "it into has shape [4, 6]",
                         std::invalid_argument);
    auto ints = Tensor<Rows, std::int32_t>::zeros(mesh, {6, 4});
    CHECK_THROWS_WITH_AS(sl::io::load(file, {{"a", ints}}),
                         ("shardlib::io::load: tensor 'a' is f32 in checkpoint '" + file +
                          "' but the tensor to load it into is i32").c_str(),
                         std::invalid_argument);
    CHECK(x.to_host() == nines);
    CHECK_THROWS_WITH_AS(sl::io::read<double>(file, "a"), doctest::Contains("is f32"), std::invalid_argument);
    // Names.
    CHECK_THROWS_WITH_AS(sl::io::save(file, {{"a", a}, {"a", a}}), doctest::Contains("'a' appears twice"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::io::save(file, {{"", a}}), doctest::Contains("is not usable"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sl::io::save(file, {{"x//y", a}}), doctest::Contains("is not usable"), std::invalid_argument);
    // A path in a missing directory, a directory, something that is not a checkpoint.
    CHECK_THROWS_WITH_AS(sl::io::save(dir / "missing/ck.h5", {{"a", a}}),
                         doctest::Contains(("cannot create checkpoint '" + (dir / "missing/ck.h5") + "' (in directory '" +
                                            (dir / "missing") + "'): No such file or directory").c_str()),
                         sl::io::Error);
    CHECK_THROWS_WITH_AS(sl::io::save(dir.path, {{"a", a}}), doctest::Contains("is a directory"), sl::io::Error);
    CHECK_THROWS_WITH_AS(sl::io::load(dir.path, {{"a", x}}), doctest::Contains("is a directory"), sl::io::Error);
    if (ctx.device() == 0) std::ofstream(dir / "text.h5") << "not hdf5\n";
    ctx.world().barrier();
    CHECK_THROWS_WITH_AS(sl::io::load(dir / "text.h5", {{"a", x}}), doctest::Contains("is not an HDF5 file"), sl::io::Error);
    if (ctx.device() == 0) {
      const hid_t f = H5Fcreate((dir / "plain.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      H5Fclose(f);
    }
    ctx.world().barrier();
    CHECK_THROWS_WITH_AS(sl::io::load(dir / "plain.h5", {{"a", x}}), doctest::Contains("not a shardlib checkpoint"),
                         sl::io::Error);
    CHECK(x.to_host() == nines);
    // No write permission (root may write anywhere: then a path under /proc stands in).
    const std::string denied = ::geteuid() == 0 ? "/proc/shardlib_ck.h5" : dir / "ro/ck.h5";
    if (::geteuid() != 0 && ctx.device() == 0) fs::create_directory(dir / "ro"), fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    ctx.world().barrier();
    CHECK_THROWS_WITH_AS(sl::io::save(denied, {{"a", a}}), doctest::Contains("cannot create checkpoint"), sl::io::Error);
    // After all this, the checkpoint is still whole.
    sl::io::load(file, {{"a", x}});
    CHECK(x.to_host() == values<float>(24, 0));
  });
}

TEST_CASE("corruption: a flipped data byte names the tensor and block; a truncated file is refused; never garbage") {
  if (sl::test::mpi_runtime()) return;  // rewrites files from one process
  const std::string file = (fs::temp_directory_path() / ("shardlib_io_bad_" + std::to_string(::getpid()) + ".h5")).string();
  const std::string bad = file + ".bad";
  const auto want = values<float>(40 * 9, 5);
  sl::Runtime::threads(4).spmd([&](sl::Context& ctx) {
    M2 mesh(ctx, {2, 2});
    sl::io::save(file, {{"w", make<Grid, float>(mesh, {40, 9}, 5)}});
  });
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  haddr_t data_at = 0;
  {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, "w", H5P_DEFAULT);
    data_at = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  auto write_bad = [&](const std::vector<char>& b) { std::ofstream(bad, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size())); };
  // Element (20, 4) lies in block 2 of the 2x2 grid ([20:40, 0:5]).
  auto flipped = bytes;
  flipped[data_at + (20 * 9 + 4) * sizeof(float) + 1] ^= 0x10;
  write_bad(flipped);
  CHECK_THROWS_WITH_AS(sl::io::read<float>(bad, "w"),
                       doctest::Contains("is corrupt: tensor 'w', block 2 [20:40, 0:5] (saved with Spec<\"x\", \"y\"> on "
                                         "{x: 2, y: 2}) does not match its checksum"),
                       sl::io::Error);
  sl::Runtime::threads(3).spmd([&](sl::Context& ctx) {
    auto t = Tensor<Rows>::zeros(mesh_of(ctx), {40, 9});
    CHECK_THROWS_WITH_AS(sl::io::load(bad, {{"w", t}}), doctest::Contains("tensor 'w', block 2 [20:40, 0:5]"), sl::io::Error);
    CHECK(t.to_host() == std::vector<float>(360, 0.0f));
    sl::io::load(bad, {{"w", t}}, {.verify_checksums = false});  // the option skips the check
    CHECK(t.to_host() != want);
  });
  // Truncated anywhere: refused.
  for (std::size_t keep : {std::size_t{0}, std::size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    write_bad(std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    CAPTURE(keep);
    CHECK_THROWS_AS(sl::io::read<float>(bad, "w"), sl::io::Error);
  }
  // A byte flipped anywhere in the file: an error, or (in bytes nothing reads) the exact values.
  std::mt19937 rng(7);
  int errors = 0, intact = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto b = bytes;
    const std::size_t at = trial < static_cast<int>(b.size()) && trial < 64 ? static_cast<std::size_t>(trial) * b.size() / 64
                                                                          : rng() % b.size();
    b[at] = static_cast<char>(b[at] ^ static_cast<char>(1 + rng() % 255));
    write_bad(b);
    try {
      const auto h = sl::io::read<float>(bad, "w");
      CAPTURE(at);
      CHECK(h.data == want);
      ++intact;
    } catch (const std::exception&) {
      ++errors;
    }
  }
  MESSAGE("flipped bytes: " << errors << " refused, " << intact << " harmless (unread bytes), none silent");
  CHECK(errors > 0);
  fs::remove(file);
  fs::remove(bad);
}

TEST_CASE("an interrupted or failed save leaves the previous checkpoint intact and no temporary file") {
  if (sl::test::mpi_runtime()) return;  // fault injection, fork and process limits: one process
  const fs::path dir = fs::temp_directory_path() / ("shardlib_io_faults_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "ck.h5").string();
  const auto old_values = values<float>(64 * 64, 1);
  auto run = [&](int devices, int salt, const std::function<void()>& before) {
    sl::Runtime::threads(devices).spmd([&](sl::Context& ctx) {
      M2 mesh(ctx, {devices, 1});
      auto t = make<Grid, float>(mesh, {64, 64}, salt);
      if (ctx.device() == 0 && before) before();
      ctx.world().barrier();
      sl::io::save(file, {{"w", t}});
    });
  };
  auto files_in_dir = [&] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
    return n;
  };
  run(2, 1, {});
  for (const char* point : {"metadata_written", "data_written"}) {
    CAPTURE(point);
    sl::io::detail::fault_hook() = [point](const char* where, int) {
      if (std::string(where) == point) throw std::runtime_error(std::string("injected failure at ") + where);
    };
    CHECK_THROWS_WITH_AS(run(2, 2, {}), doctest::Contains("injected failure"), sl::io::Error);
    sl::io::detail::fault_hook() = nullptr;
    CHECK(sl::io::read<float>(file, "w").data == old_values);
    CHECK(files_in_dir() == 1);
  }
  // Disk full part way (the file size limit stands in): an error, the old checkpoint intact.
  {
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    CHECK_THROWS_AS(run(2, 3, [&] {
                      rlimit small = old;
                      small.rlim_cur = 4096;
                      ::setrlimit(RLIMIT_FSIZE, &small);
                    }),
                    sl::io::Error);
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK(sl::io::read<float>(file, "w").data == old_values);
    CHECK(files_in_dir() == 1);
  }
  // A writer killed before the rename: the old checkpoint is intact (its temporary file stays).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    sl::io::detail::fault_hook() = [](const char* where, int) {
      if (std::string(where) == "data_written") std::_Exit(3);
    };
    run(2, 4, {});
    std::_Exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 3));
  CHECK(sl::io::read<float>(file, "w").data == old_values);
  CHECK(files_in_dir() == 2);  // ck.h5 and the killed save's ck.h5.tmp-*
  // The next save replaces it.
  run(2, 5, {});
  CHECK(sl::io::read<float>(file, "w").data == values<float>(64 * 64, 5));
  fs::remove_all(dir);
}
}  // TEST_SUITE("io") part 1

namespace {
// All devices' smallest and largest hash of a message: equal when every device has the same one.
bool same_on_every_device(sl::Context& ctx, const std::string& s) {
  const auto h = static_cast<std::int64_t>(std::hash<std::string>{}(s) >> 1);
  std::int64_t mine[2] = {h, -h}, most[2] = {0, 0};
  ctx.world().all_reduce(mine, most, 2, sl::coll::DType::i64, sl::coll::Op::max);
  return most[0] == -most[1];
}
// The message of the io::Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sl::io::Error& e) {
    return e.what();
  }
  return "";
}
// Process-wide test switches (the fault hook, reserve_space) are set by one device per process.
bool first_in_process(sl::Context& ctx) { return !ctx.shares_process() || ctx.device() == 0; }
}  // namespace

TEST_SUITE("io") {
TEST_CASE("a full disk or a failed write on any device fails the save on every device: old checkpoint intact, no hang") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const int last = ctx.num_devices() - 1;
        // A 1 MiB tmpfs (root only: elsewhere the full-disk part is skipped, the injected failures run).
        std::vector<unsigned char> buf(256, 0);
        std::int32_t mounted = 0;
        if (ctx.device() == 0) {
          std::string tmpl = (fs::temp_directory_path() / "shardlib_io_full_XXXXXX").string();
          REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
          std::copy(tmpl.begin(), tmpl.end(), buf.begin());
          mounted = ::mount("tmpfs", tmpl.c_str(), "tmpfs", 0, "size=1m") == 0;
        }
        ctx.world().broadcast(buf.data(), buf.size(), sl::coll::DType::u8, 0);
        ctx.world().broadcast(&mounted, 1, sl::coll::DType::i32, 0);
        const std::string dir = reinterpret_cast<const char*>(buf.data());
        const std::string file = dir + "/ck.h5";
        M1 line(ctx, {ctx.num_devices()});
        const auto old_values = values<float>(64 * 64, 1);
        sl::io::save(file, {{"w", make<D0, float>(line, {64, 64}, 1)}});
        auto intact = [&] {
          CHECK(sl::io::read<float>(file, "w").data == old_values);
          int entries = 0;
          for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
          CHECK(entries == 1);  // no temporary file left
        };
        auto set_reserve = [&](bool on) {
          ctx.world().barrier();
          if (first_in_process(ctx)) sl::io::detail::reserve_space() = on;
          ctx.world().barrier();
        };
        if (mounted) {
          auto big = make<D0, float>(line, {1024, 512}, 2);  // 2 MiB on a 1 MiB disk
          // The whole file reserved first: refused before any device writes.
          std::string e = error_of([&] { sl::io::save(file, {{"w", big}}); });
          CHECK(e.find("does not fit on its disk") != std::string::npos);
          CHECK(e.find("No space left on device") != std::string::npos);
          CHECK(same_on_every_device(ctx, e));
          intact();
          // Without the reservation, the devices' writes meet the full disk themselves.
          set_reserve(false);
          e = error_of([&] { sl::io::save(file, {{"w", big}}); });
          CAPTURE(e);
          CHECK(e.find("No space left on device") != std::string::npos);
          CHECK(e.find(".tmp-") != std::string::npos);  // the file written, the bytes and where
          CHECK(e.find(" bytes at byte ") != std::string::npos);
          CHECK(same_on_every_device(ctx, e));
          set_reserve(true);
          intact();
        } else if (ctx.device() == 0) {
          MESSAGE("not root: the full-disk part is skipped (a tmpfs cannot be mounted)");
        }
        // A write that fails on the last device only: every device throws its message.
        ctx.world().barrier();
        if (first_in_process(ctx))
          sl::io::detail::fault_hook() = [last](const char* where, int device) {
            if (std::string(where) == "write" && device == last)
              throw std::runtime_error("injected write failure on device " + std::to_string(device));
          };
        ctx.world().barrier();
        std::string e = error_of([&] { sl::io::save(file, {{"w", make<D0, float>(line, {64, 64}, 3)}}); });
        CHECK(e.find("injected write failure on device " + std::to_string(last)) != std::string::npos);
        CHECK(same_on_every_device(ctx, e));
        ctx.world().barrier();
        if (first_in_process(ctx)) sl::io::detail::fault_hook() = nullptr;
        ctx.world().barrier();
        intact();
        // Under mpi: a real write error (the file size limit) in the last process alone.
        if (sl::test::mpi_runtime() && last > 0) {
          rlimit old{};
          REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
          auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
          if (ctx.device() == last) {
            rlimit small = old;
            small.rlim_cur = 4096;
            ::setrlimit(RLIMIT_FSIZE, &small);
          }
          e = error_of([&] { sl::io::save(file, {{"w", make<D0, float>(line, {64, 64}, 4)}}); });
          ::setrlimit(RLIMIT_FSIZE, &old);
          std::signal(SIGXFSZ, old_handler);
          CAPTURE(e);
          CHECK(e.find("device " + std::to_string(last)) != std::string::npos);
          CHECK(e.find("File too large") != std::string::npos);
          CHECK(same_on_every_device(ctx, e));
          intact();
        }
        // The next save succeeds.
        sl::io::save(file, {{"w", make<D0, float>(line, {64, 64}, 5)}});
        CHECK(sl::io::read<float>(file, "w").data == values<float>(64 * 64, 5));
        ctx.world().barrier();
        if (ctx.device() == 0) {
          if (mounted) CHECK(::umount(dir.c_str()) == 0);
          fs::remove_all(dir);
        }
      },
      {1, 2, 4});
}

TEST_CASE("a load while another process saves the same path gets the old or the new checkpoint, never 'corrupt'") {
  if (sl::test::mpi_runtime()) return;  // forks a writer
  const fs::path dir = fs::temp_directory_path() / ("shardlib_io_race_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "ck.h5").string();
  const std::array<std::int64_t, 2> shape{256, 256};
  const auto a = values<float>(shape[0] * shape[1], 1), b = values<float>(shape[0] * shape[1], 2);
  auto save = [&](int salt) {
    sl::Runtime::threads(2).spmd([&](sl::Context& ctx) {
      M1 line(ctx, {2});
      sl::io::save(file, {{"w", make<D0, float>(line, shape, salt)}}, {.durable = false});
    });
  };
  save(1);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // saves b, a, b, ... over the same path until killed
    try {
      sl::Runtime::threads(2).spmd([&](sl::Context& ctx) {
        M1 line(ctx, {2});
        auto ta = make<D0, float>(line, shape, 1), tb = make<D0, float>(line, shape, 2);
        for (int i = 0;; ++i) sl::io::save(file, {{"w", i % 2 ? ta : tb}}, {.durable = false});
      });
    } catch (...) {
    }
    std::_Exit(1);
  }
  int loads = 0, reads = 0, seen_a = 0, seen_b = 0;
  std::string failure;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  try {
    sl::Runtime::threads(3).spmd([&](sl::Context& ctx) {
      M1 line(ctx, {3});
      auto t = Tensor<D1, float, M1>::zeros(line, shape);
      for (std::int32_t go = 1; go;) {
        sl::io::load(file, {{"w", t}});
        const auto h = t.to_host();
        if (ctx.device() == 0) {
          ++loads;
          seen_a += h == a;
          seen_b += h == b;
          CHECK((h == a || h == b));
          const auto r = sl::io::read<float>(file, "w").data;  // the runtime-free reader too
          ++reads;
          CHECK((r == a || r == b));
        }
        go = std::chrono::steady_clock::now() < until;
        ctx.world().broadcast(&go, 1, sl::coll::DType::i32, 0);
      }
    });
  } catch (const std::exception& e) {
    failure = e.what();
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  MESSAGE(loads << " loads and " << reads << " reads during saves (" << seen_a << " old, " << seen_b << " new)");
  CHECK(failure == "");
  CHECK(loads > 10);
  fs::remove_all(dir);
}

TEST_CASE("a corrupt checkpoint's errors name the file and do not contradict themselves") {
  if (sl::test::mpi_runtime()) return;  // rewrites files from one process
  const std::string file = (fs::temp_directory_path() / ("shardlib_io_hdr_" + std::to_string(::getpid()) + ".h5")).string();
  const std::string bad = file + ".bad";
  sl::Runtime::threads(2).spmd([&](sl::Context& ctx) {
    M1 line(ctx, {2});
    auto step = Tensor<D0, std::int64_t, M1>::full(line, {2, 1}, 7);
    sl::io::save(file, {{"step", step}, {"w", make<D0, float>(line, {8, 4}, 1)}});
  });
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Every byte of the metadata in front of the data, each flipped alone.
  haddr_t data_at = bytes.size();
  {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    for (const char* name : {"step", "w"}) {
      const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
      data_at = std::min<haddr_t>(data_at, H5Dget_offset(d));
      H5Dclose(d);
    }
    H5Fclose(f);
  }
  int refused = 0;
  for (std::size_t at = 0; at < data_at; ++at) {
    auto b = bytes;
    b[at] = static_cast<char>(b[at] ^ 0x5a);
    std::ofstream(bad, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    for (int call = 0; call < 2; ++call) {
      std::string e;
      try {
        if (call == 0) (void)sl::io::read<float>(bad, "w");
        else (void)sl::io::list(bad);
      } catch (const sl::io::Error& x) {
        e = x.what();
      }
      if (e.empty()) continue;
      ++refused;
      CAPTURE(at);
      CAPTURE(e);
      CHECK(e.find("'" + bad + "'") != std::string::npos);
      const auto has = e.find("(it has: ");
      if (has != std::string::npos) {  // a missing tensor is not in the list given with it
        const std::string list = e.substr(has + 9, e.find(')', has) - has - 9) + ",";
        CHECK(list.find("w,") == std::string::npos);
      }
    }
  }
  MESSAGE(data_at << " metadata bytes flipped one at a time: " << refused << " refusals, each naming the file");
  CHECK(refused > 0);
  fs::remove(file);
  fs::remove(bad);
}
}
