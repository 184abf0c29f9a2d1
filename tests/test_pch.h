// What nearly every test program reads, precompiled once for all of them (tests/CMakeLists.txt,
// LOOM_TEST_PCH): GoogleTest, the standard headers, nlohmann-json and Loom's tensor, ops and
// autograd headers. Precompiled, they took 0.3-3.7 s off each of four test files' 3-8 s compiles.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "engine/ops.h"
#include "engine/tensor.h"
