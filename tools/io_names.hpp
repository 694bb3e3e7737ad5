#pragma once
// The CLI reads and writes .npy, .npz and map files with favor_io (src/io), shared with the
// Python package; its names are used unqualified in favor::cli.
#include "map_file.hpp"
#include "mapped_file.hpp"
#include "npy.hpp"
#include "npz.hpp"
#include "printable.hpp"

namespace favor::cli {
using namespace favor::io;
}  // namespace favor::cli
