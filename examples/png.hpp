// SPDX-License-Identifier: Apache-2.0
// A tiny PNG writer for the examples' pictures: 8-bit RGB, zlib "stored" blocks (no
// compression, so no zlib dependency), CRC-32 and Adler-32 computed here. Any image viewer opens
// the files; they are as large as the raw pixels.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace example {

inline std::uint32_t crc32(const std::uint8_t* p, std::size_t n, std::uint32_t c = 0xffffffffu) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t v = i;
      for (int k = 0; k < 8; ++k) v = v & 1 ? 0xedb88320u ^ (v >> 1) : v >> 1;
      t[i] = v;
    }
    return t;
  }();
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

/// Colour of t in [0, 1] on a dark-blue, red, yellow, white ramp (a heat map).
inline std::array<std::uint8_t, 3> heat_colour(double t) {
  static const double stops[][3] = {{0.00, 0.00, 0.20}, {0.55, 0.05, 0.35}, {0.90, 0.30, 0.05}, {1.00, 0.85, 0.20}, {1.00, 1.00, 1.00}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 4;
  const int i = std::min(static_cast<int>(t), 3);
  const double f = t - i;
  std::array<std::uint8_t, 3> c{};
  for (int k = 0; k < 3; ++k) c[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(255 * (stops[i][k] + f * (stops[i + 1][k] - stops[i][k])) + 0.5);
  return c;
}

/// Writes `values` (rows x cols, row-major) as a PNG picture, scaled from [lo, hi] to the heat
/// ramp. Throws std::runtime_error when the file cannot be written.
inline void write_png(const std::string& path, const std::vector<double>& values, std::int64_t rows, std::int64_t cols,
                      double lo, double hi) {
  std::vector<std::uint8_t> raw;  // scanlines, each with filter byte 0
  raw.reserve(static_cast<std::size_t>(rows * (1 + 3 * cols)));
  for (std::int64_t i = 0; i < rows; ++i) {
    raw.push_back(0);
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto c = heat_colour((values[static_cast<std::size_t>(i * cols + j)] - lo) / (hi > lo ? hi - lo : 1));
      raw.insert(raw.end(), c.begin(), c.end());
    }
  }
  std::vector<std::uint8_t> z = {0x78, 0x01};  // zlib header, stored blocks of at most 65535 bytes
  std::uint32_t a = 1, b = 0;
  for (std::size_t at = 0; at < raw.size() || raw.empty();) {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - at);
    z.push_back(at + n == raw.size() ? 1 : 0);
    z.push_back(static_cast<std::uint8_t>(n & 0xff));
    z.push_back(static_cast<std::uint8_t>(n >> 8));
    z.push_back(static_cast<std::uint8_t>(~n & 0xff));
    z.push_back(static_cast<std::uint8_t>((~n >> 8) & 0xff));
    for (std::size_t k = at; k < at + n; ++k) {
      a = (a + raw[k]) % 65521;
      b = (b + a) % 65521;
    }
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(at), raw.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    if (raw.empty()) break;
  }
  const std::uint32_t adler = (b << 16) | a;
  for (int s = 24; s >= 0; s -= 8) z.push_back(static_cast<std::uint8_t>(adler >> s));
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto chunk = [&](const char* type, const std::vector<std::uint8_t>& data) {
    const auto n = static_cast<std::uint32_t>(data.size());
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(n >> s));
    const std::size_t start = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), data.begin(), data.end());
    const std::uint32_t crc = ~crc32(out.data() + start, out.size() - start);
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(crc >> s));
  };
  std::vector<std::uint8_t> header;
  for (auto v : {static_cast<std::uint32_t>(cols), static_cast<std::uint32_t>(rows)})
    for (int s = 24; s >= 0; s -= 8) header.push_back(static_cast<std::uint8_t>(v >> s));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, no filter, no interlace
  chunk("IHDR", header);
  chunk("IDAT", z);
  chunk("IEND", {});
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fclose(f) != 0) {
    if (f) std::fclose(f);
    throw std::runtime_error("cannot write the picture " + path);
  }
}

}  // namespace example
