// Streaming safetensors I/O: SafetensorsStreamWriter (header first, tensors written in any
// order and in pieces, from several threads) and SafetensorsReader (header only, pread).

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "slimserve/int4/safetensors.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;
using slimserve::StatusCode;

namespace {

std::filesystem::path temp_file(const char* tag) {
  return std::filesystem::temp_directory_path() /
         ("slimserve_stream_" + std::string(tag) + "_" + std::to_string(slimserve_test::test_seed()) + "_" +
          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + ".safetensors");
}

/// "t<i>" (built with += : GCC 12 warns falsely on "literal" + std::string under -O3).
std::string tensor_name(std::size_t i) {
  std::string name = "t";
  name += std::to_string(i);
  return name;
}

std::vector<int4::Tensor> random_tensors(std::mt19937& rng) {
  const std::vector<std::pair<int4::ElementType, std::vector<std::int64_t>>> shapes = {
      {int4::ElementType::bfloat16, {7, 13}}, {int4::ElementType::int32, {3, 5, 4}}, {int4::ElementType::uint8, {0}},
      {int4::ElementType::float32, {129}},    {int4::ElementType::int64, {2}},       {int4::ElementType::float8_e4m3, {33, 3}}};
  std::vector<int4::Tensor> tensors;
  for (const auto& [type, shape] : shapes) {
    int4::Tensor t(type, shape);
    for (auto& b : t.bytes) b = static_cast<std::byte>(rng());
    tensors.push_back(std::move(t));
  }
  return tensors;
}

}  // namespace

TEST_CASE("safetensors stream: pieces in any order from several threads read back exactly", "[int4][safetensors]") {
  std::mt19937 rng(slimserve_test::test_seed());
  const auto tensors = random_tensors(rng);
  std::vector<int4::SafetensorsStreamWriter::Planned> plan;
  for (std::size_t i = 0; i < tensors.size(); ++i) plan.push_back({tensor_name(i), tensors[i].type, tensors[i].shape});
  const auto path = temp_file("pieces");
  auto writer = int4::SafetensorsStreamWriter::create(path.string(), plan, {{"format", "pt"}});
  REQUIRE(writer.ok());

  // Cut every tensor into pieces of random size and write them shuffled, from two threads.
  struct Piece { std::size_t tensor; std::size_t begin, end; };
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t size = tensors[i].bytes.size();
    std::size_t at = 0;
    do {
      const std::size_t end = std::min(size, at + 1 + rng() % 40);
      pieces.push_back({i, at, end});
      at = end;
    } while (at < size);
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  REQUIRE(writer->finish().code() == StatusCode::failed_precondition);  // nothing written yet
  std::vector<std::thread> threads;
  std::atomic<bool> all_ok{true};
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t p = static_cast<std::size_t>(t); p < pieces.size(); p += 2) {
        const Piece& piece = pieces[p];
        const auto& bytes = tensors[piece.tensor].bytes;
        const std::span<const std::byte> part(bytes.data() + piece.begin, piece.end - piece.begin);
        if (!writer->write(tensor_name(piece.tensor), part, piece.begin).ok()) all_ok = false;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(all_ok);
  REQUIRE(writer->write("nope", {}).code() == StatusCode::invalid_argument);
  std::byte extra[4] = {};
  REQUIRE(writer->write("t0", extra, tensors[0].bytes.size() - 2).code() == StatusCode::invalid_argument);
  REQUIRE(writer->finish().ok());

  // The whole-file reader agrees byte for byte, and so does the streaming reader.
  auto file = int4::SafetensorsFile::read(path.string());
  REQUIRE(file.ok());
  REQUIRE(file->metadata().at("format") == "pt");
  auto reader = int4::SafetensorsReader::open(path.string());
  REQUIRE(reader.ok());
  REQUIRE(reader->entries().size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = tensor_name(i);
    auto view = file->tensor(name);
    REQUIRE(view.ok());
    REQUIRE(std::equal(view->bytes.begin(), view->bytes.end(), tensors[i].bytes.begin(), tensors[i].bytes.end()));
    const auto* entry = reader->find(name);
    REQUIRE(entry != nullptr);
    auto read = reader->read(*entry);
    REQUIRE(read.ok());
    REQUIRE(read->type == tensors[i].type);
    REQUIRE(read->shape == tensors[i].shape);
    REQUIRE(read->bytes == tensors[i].bytes);
    if (tensors[i].bytes.size() >= 3) {  // a part in the middle
      std::vector<std::byte> part(tensors[i].bytes.size() - 2, std::byte{0xEE});
      REQUIRE(reader->read_bytes(*entry, 1, part).ok());
      REQUIRE(std::equal(part.begin(), part.end(), tensors[i].bytes.begin() + 1));
      std::vector<std::byte> too_long(tensors[i].bytes.size());
      REQUIRE(reader->read_bytes(*entry, 1, too_long).code() == StatusCode::out_of_range);
    }
  }
  REQUIRE(reader->find("absent") == nullptr);
  std::filesystem::remove(path);
}

TEST_CASE("safetensors stream: bad plans and bad files are refused", "[int4][safetensors]") {
  const auto path = temp_file("bad");
  REQUIRE(int4::SafetensorsStreamWriter::create(path.string(), {{"a", int4::ElementType::int32, {2}},
                                                                {"a", int4::ElementType::int32, {2}}}, {})
              .status().code() == StatusCode::invalid_argument);
  REQUIRE(int4::SafetensorsStreamWriter::create(path.string(), {{"__metadata__", int4::ElementType::int32, {2}}}, {})
              .status().code() == StatusCode::invalid_argument);
  REQUIRE(int4::SafetensorsStreamWriter::create(path.string(), {{"n", int4::ElementType::int32, {-1}}}, {})
              .status().code() == StatusCode::invalid_argument);
  REQUIRE(int4::SafetensorsReader::open((path.string() + ".absent")).status().code() == StatusCode::io_error);

  // A header length running past the end of the file, and a tensor range past the data.
  auto writer = int4::SafetensorsStreamWriter::create(path.string(), {{"x", int4::ElementType::int32, {4}}}, {});
  REQUIRE(writer.ok());
  std::byte zeros[16] = {};
  REQUIRE(writer->write("x", zeros).ok());
  REQUIRE(writer->finish().ok());
  REQUIRE(int4::SafetensorsReader::open(path.string()).ok());
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const char huge[8] = {'\xff', '\xff', 0, 0, 0, 0, 0, 0};
    file.write(huge, 8);
  }
  REQUIRE(int4::SafetensorsReader::open(path.string()).status().code() == StatusCode::data_loss);
  std::filesystem::resize_file(path, 4);
  REQUIRE(int4::SafetensorsReader::open(path.string()).status().code() == StatusCode::data_loss);
  std::filesystem::remove(path);
}
