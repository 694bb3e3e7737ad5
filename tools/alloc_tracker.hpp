#pragma once
// Heap accounting for `favor bench`: the favor executable replaces the global operator
// new/delete (libfavor's allocations go through them too) and counts live bytes.
#include <cstdint>

namespace favor::cli {

/// Starts a measurement window: the peak is reset to the bytes live now.
void reset_heap_peak();
/// Peak of live heap bytes since the last reset, minus the bytes live at the reset.
int64_t heap_peak_growth();

}  // namespace favor::cli
