// .safetensors reader/writer: round trips, hand-written files in the real layout, files
// written by the reference Python package (the committed fixtures), and every kind of
// inconsistency the reader must refuse.

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "int4_test_util.hpp"
#include "slimserve/int4/safetensors.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;
using int4::ElementType;
using slimserve::StatusCode;

namespace {

/// A file image: little-endian length, the header text as given, then `data`.
std::vector<std::byte> file_image(const std::string& header, const std::vector<unsigned char>& data) {
  std::vector<std::byte> out;
  std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(length >> (8 * i)));
  for (char ch : header) out.push_back(static_cast<std::byte>(ch));
  for (unsigned char b : data) out.push_back(static_cast<std::byte>(b));
  return out;
}

std::string tensor_name(std::size_t i) {
  std::string name = "t";
  name += std::to_string(i);
  return name;
}

/// "{" + parts joined by "," + "}" (appends: GCC 12 warns falsely on chained string +).
std::string json_object(std::initializer_list<std::string> parts) {
  std::string out = "{";
  for (const auto& part : parts) {
    if (out.size() > 1) out += ',';
    out += part;
  }
  out += '}';
  return out;
}

void require_data_loss(const std::string& header, const std::vector<unsigned char>& data, const char* fragment) {
  auto parsed = int4::SafetensorsFile::parse(file_image(header, data));
  REQUIRE_FALSE(parsed.ok());
  INFO(parsed.status().to_string());
  REQUIRE(parsed.status().code() == StatusCode::data_loss);
  REQUIRE(parsed.status().to_string().find(fragment) != std::string::npos);
}

}  // namespace

TEST_CASE("safetensors: a hand-written file in the documented layout", "[int4][safetensors]") {
  // Two tensors out of name order, metadata, header padded with spaces.
  const std::string header =
      R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[6,14]},)"
      R"("a":{"dtype":"BF16","shape":[1,3],"data_offsets":[0,6]},)"
      R"("__metadata__":{"format":"pt"}}   )";
  const std::vector<unsigned char> data = {0x80, 0x3F, 0x00, 0x40, 0x40, 0xC0,  // bf16 1, 2, -3
                                           0x07, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF};  // i32 7, -1
  auto file = int4::SafetensorsFile::parse(file_image(header, data));
  REQUIRE(file.ok());
  REQUIRE(file->metadata().at("format") == "pt");
  REQUIRE(file->entries().size() == 2);
  REQUIRE(file->entries()[0].name == "a");  // data order
  auto a = file->tensor("a");
  REQUIRE(a.ok());
  REQUIRE(a->type == ElementType::bfloat16);
  REQUIRE(a->shape == std::vector<std::int64_t>{1, 3});
  REQUIRE(a->at<std::uint16_t>(2) == 0xC040);
  auto b = file->tensor("b");
  REQUIRE(b.ok());
  REQUIRE(b->at<std::int32_t>(0) == 7);
  REQUIRE(b->at<std::int32_t>(1) == -1);
  REQUIRE(file->tensor("c").status().code() == StatusCode::out_of_range);
}

TEST_CASE("safetensors: writer output parses back identically", "[int4][safetensors]") {
  auto rng = slimserve_test::make_rng(51);
  int4::SafetensorsWriter writer;
  std::vector<int4::Tensor> tensors;
  const std::vector<ElementType> types = {ElementType::float32, ElementType::bfloat16, ElementType::int32,
                                          ElementType::float8_e4m3, ElementType::int64, ElementType::float16};
  for (std::size_t i = 0; i < types.size(); ++i) {
    int4::Tensor t(types[i], {static_cast<std::int64_t>(1 + rng() % 5), static_cast<std::int64_t>(1 + rng() % 7)});
    for (auto& b : t.bytes) b = static_cast<std::byte>(rng());
    REQUIRE(writer.add(tensor_name(i), t.view()).ok());
    tensors.push_back(std::move(t));
  }
  int4::Tensor empty(ElementType::float32, {0, 4});
  REQUIRE(writer.add("empty", empty.view()).ok());
  writer.set_metadata("format", "pt");
  REQUIRE(writer.add("t0", tensors[0].view()).code() == StatusCode::invalid_argument);  // duplicate
  REQUIRE(writer.add("__metadata__", tensors[0].view()).code() == StatusCode::invalid_argument);

  const auto image = writer.serialize();
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, image.data(), 8);
  REQUIRE((8 + header_length) % 8 == 0);  // data section aligned

  const auto path = std::filesystem::temp_directory_path() /
                    ("slimserve_int4_" + std::to_string(slimserve_test::test_seed()) + ".safetensors");
  REQUIRE(writer.write(path.string()).ok());
  auto file = int4::SafetensorsFile::read(path.string());
  std::filesystem::remove(path);
  REQUIRE(file.ok());
  REQUIRE(file->metadata().at("format") == "pt");
  REQUIRE(file->entries().size() == tensors.size() + 1);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto view = file->tensor(tensor_name(i));
    REQUIRE(view.ok());
    REQUIRE(view->type == tensors[i].type);
    REQUIRE(view->shape == tensors[i].shape);
    REQUIRE(std::equal(view->bytes.begin(), view->bytes.end(), tensors[i].bytes.begin(), tensors[i].bytes.end()));
  }
  REQUIRE(file->tensor("empty")->numel() == 0);
  REQUIRE(int4::SafetensorsFile::read(path.string()).status().code() == StatusCode::io_error);
}

TEST_CASE("safetensors: inconsistent files are refused", "[int4][safetensors]") {
  const std::vector<unsigned char> four = {1, 2, 3, 4};
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  SECTION("shorter than the length field") {
    auto parsed = int4::SafetensorsFile::parse(std::vector<std::byte>(5));
    REQUIRE(parsed.status().code() == StatusCode::data_loss);
  }
  SECTION("header length past the end") {
    auto image = file_image(json_object({ok_entry}), four);
    image[0] = static_cast<std::byte>(200);
    auto parsed = int4::SafetensorsFile::parse(image);
    REQUIRE(parsed.status().code() == StatusCode::data_loss);
    REQUIRE(parsed.status().to_string().find("exceeds") != std::string::npos);
  }
  SECTION("not JSON") { require_data_loss("{\"x\":", four, "not a JSON object"); }
  SECTION("not an object") { require_data_loss("[1,2]", four, "start with '{'"); }
  SECTION("duplicate key") { require_data_loss(json_object({ok_entry, ok_entry}), four, "repeats the key 'x'"); }
  SECTION("unknown dtype") {
    require_data_loss(R"({"x":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", four, "unknown dtype 'F31'");
  }
  SECTION("negative extent") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", four, "non-negative integer");
  }
  SECTION("fractional extent") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})", four, "non-negative integer");
  }
  SECTION("size does not match shape x dtype") {
    require_data_loss(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four, "needs 8");
  }
  SECTION("range outside the data") {
    require_data_loss(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", four, "outside the 4-byte");
  }
  SECTION("reversed range") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", four, "outside");
  }
  SECTION("overlap") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"y":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                      four, "inside the previous tensor");
  }
  SECTION("hole") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})",
                      four, "leaving a hole");
  }
  SECTION("trailing bytes") {
    require_data_loss(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", four, "tensors cover 3");
  }
  SECTION("missing field") { require_data_loss(R"({"x":{"dtype":"U8","shape":[4]}})", four, "exactly dtype"); }
  SECTION("non-string metadata") {
    require_data_loss(json_object({R"("__metadata__":{"a":1})", ok_entry}), four, "not a string");
  }
}

TEST_CASE("safetensors: overflowing shapes are refused", "[int4][safetensors]") {
  require_data_loss(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                    {1, 2, 3, 4}, "overflows");
}
