// read_json_file: every way a JSON file from elsewhere can be unreadable is a Status naming the
// path and the reason (a folder in its place used to throw from the stream inside the parser).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/json_file.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

TEST(JsonFile, ReadsAnObject) {
  test::TempDir dir("loom_json");
  write(dir.file("a.json"), R"({"hidden_size": 64, "names": ["q", "k"]})");
  auto j = read_json_file(dir.file("a.json"));
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["hidden_size"], 64);
  EXPECT_EQ((*j)["names"][1], "k");
}

TEST(JsonFile, UnreadableFilesSayWhy) {
  test::TempDir dir("loom_json");
  std::filesystem::create_directories(dir.file("folder.json"));
  auto folder = read_json_file(dir.file("folder.json"));
  ASSERT_FALSE(folder.ok());
  EXPECT_TRUE(absl::IsNotFound(folder.status()));
  EXPECT_EQ(folder.status().message(), dir.file("folder.json") + ": cannot open: Is a directory");

  auto missing = read_json_file(dir.file("missing.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), dir.file("missing.json") + ": cannot open: No such file or directory");

  write(dir.file("empty.json"), "");
  write(dir.file("broken.json"), "{\"a\": [1, 2");
  for (const char* name : {"empty.json", "broken.json"}) {
    auto bad = read_json_file(dir.file(name));
    ASSERT_FALSE(bad.ok()) << name;
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
    EXPECT_NE(bad.status().message().find(dir.file(name) + ": not valid JSON (byte "), std::string::npos)
        << bad.status();
  }
}

}  // namespace
}  // namespace loom
