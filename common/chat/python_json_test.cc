// PythonJsonDumps / PythonFloatRepr against python3's own json module, run at test time.
#include "common/chat/python_json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/chat/chat_test_util.h"

namespace dsmesh {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(PythonJsonTest, FloatReprMatchesPython) {
  std::vector<double> values = {0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 100.0, 1e15, 1e16, 1e17, 1e-4, 1e-5,
                                9999999999999998.0, 1234567890123456.7, 0.00012345, 0.000012345, 1e22, 1e300,
                                5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 3.0, 1.5e-07,
                                123456789012345.6, -2.5e-310, INFINITY, -INFINITY};
  std::mt19937_64 rng(42);
  for (int i = 0; i < 3000; ++i) {  // arbitrary bit patterns
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (std::isfinite(d)) values.push_back(d);
  }
  std::uniform_int_distribution<int> exp10(-12, 22);
  std::uniform_int_distribution<int64_t> mant(-99999999, 99999999);
  for (int i = 0; i < 3000; ++i)  // short decimals, the kind people write in schemas
    values.push_back(static_cast<double>(mant(rng)) * std::pow(10.0, exp10(rng)));

  std::string input;
  char buf[64];
  for (double v : values) {
    std::snprintf(buf, sizeof(buf), "%a\n", v);
    input += buf;
  }
  std::string path = WriteTemp("floats.txt", input);
  std::string script =
      "import json,sys\n"
      "for line in open(sys.argv[1]):\n"
      "    s=line.strip(); v=float(s) if s in ('inf','-inf') else float.fromhex(s)\n"
      "    print(json.dumps(v))\n";
  std::string out = chat_test::RunCommand("python3 -c " + chat_test::ShellQuote(script) + " " + path);
  std::vector<std::string> want = Lines(out);
  ASSERT_EQ(want.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(PythonFloatRepr(values[i]), want[i]) << "value " << values[i];
}

TEST(PythonJsonTest, DumpsMatchesPython) {
  std::string controls;
  for (int c = 0; c < 0x20; ++c) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
    controls += buf;
  }
  const std::vector<std::string> documents = {
      R"({"b": 1, "a": [true, false, null], "c": {"z": "y", "x": {}}, "d": []})",
      "{\"s\": \"" + controls + "\\u007f \\\" \\\\ / \\/ é 日本 😀 \\ud83d\\ude00 \\u2028\"}",
      R"({"a": 1, "b": 2, "a": 3, "c": {"k": 1, "k": {"n": 2}}})",  // duplicates: last value, first place
      R"([0, -0, 1, -1, 18446744073709551615, -9223372036854775808, 9223372036854775807])",
      R"([0.0, -0.0, 1E5, 1e+5, 2.50, 0.1e-10, 123456789.123456789, 1e308, 4.9e-324, 12345678901234567890.0])",
      R"("just a string")",
      R"(  {"ws" :  [ 1 ,2 ] }  )",
      R"({})",
  };
  std::string input;
  for (const std::string& d : documents) input += d + "\n";
  std::string path = WriteTemp("docs.txt", input);
  std::string script =
      "import json,sys\n"
      "for line in open(sys.argv[1], encoding='utf-8'):\n"
      "    sys.stdout.write(json.dumps(json.loads(line), ensure_ascii=False) + '\\n')\n";
  std::vector<std::string> want =
      Lines(chat_test::RunCommand("python3 -c " + chat_test::ShellQuote(script) + " " + path));
  ASSERT_EQ(want.size(), documents.size());
  for (size_t i = 0; i < documents.size(); ++i)
    EXPECT_EQ(PythonJsonDumps(ParseJsonText(documents[i], "doc")), want[i]) << documents[i];
}

TEST(PythonJsonTest, ParseErrorsAreTypedAndNamed) {
  try {
    ParseJsonText("{\"a\": }", "messages.json");
    FAIL();
  } catch (const JsonSyntaxError& e) {
    EXPECT_NE(std::string(e.what()).find("messages.json"), std::string::npos);
  }
  EXPECT_THROW(ParseJsonText("[123456789012345678901234567890]", "x"), JsonRangeError);
  EXPECT_THROW(ParseJsonText("[1e400]", "x"), JsonRangeError);
  EXPECT_THROW(ParseJsonText("\"\xff\"", "x"), JsonSyntaxError);  // invalid UTF-8
  EXPECT_THROW(ParseJsonText("[1] [2]", "x"), JsonSyntaxError);
  EXPECT_THROW(ParseJsonText("", "x"), JsonSyntaxError);
}

}  // namespace
}  // namespace dsmesh
