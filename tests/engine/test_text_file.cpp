// write_text_atomic and create_folder: the file holds exactly the new text after a write (over an
// old one too), nothing is left beside it, and a write that cannot happen says where and why and
// leaves the old file as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/text_file.h"
#include "tests/temp_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int entries(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.exists() ? 1 : 0;
  return n;
}

TEST(TextFile, WritesAndReplacesWithNothingLeftBeside) {
  test::TempDir dir("loom_text_file");
  const std::string path = dir.file("a.json");
  ASSERT_TRUE(write_text_atomic(path, "first\n").ok());
  EXPECT_EQ(read(path), "first\n");
  const std::string with_nul("x\0y", 3);
  ASSERT_TRUE(write_text_atomic(path, with_nul).ok());
  EXPECT_EQ(read(path), with_nul);
  EXPECT_EQ(entries(dir.path()), 1);
}

TEST(TextFile, AFailedWriteNamesThePathAndKeepsTheOldFile) {
  test::TempDir dir("loom_text_file");
  const std::string missing = dir.file("no/such/folder/a.json");
  const absl::Status s = write_text_atomic(missing, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/folder/a.json.tmp."), std::string::npos) << s;
  // A folder in the file's place: the rename fails, the folder stays, no temporary is left.
  const std::string folder = dir.file("taken");
  fs::create_directories(folder + "/inside");
  const absl::Status r = write_text_atomic(folder, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("taken"), std::string::npos) << r;
  EXPECT_TRUE(fs::is_directory(folder + "/inside"));
  EXPECT_EQ(entries(dir.path()), 1);
}

TEST(TextFile, CreateFolderMakesParentsAndNamesAFileInTheWay) {
  test::TempDir dir("loom_text_file");
  ASSERT_TRUE(create_folder(dir.file("a/b/c")).ok());
  EXPECT_TRUE(fs::is_directory(dir.file("a/b/c")));
  ASSERT_TRUE(create_folder(dir.file("a/b/c")).ok());  // already there
  ASSERT_TRUE(write_text_atomic(dir.file("f"), "x").ok());
  const absl::Status s = create_folder(dir.file("f/g"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot create folder"), std::string::npos) << s;
}

}  // namespace
}  // namespace loom
