// favor._core.Exchange (a Python class implements the collectives of sequence-parallel
// attention: favor.distributed's TorchExchange and MPIExchange), StateBlock (the per-head
// records those collectives move, seen as a writable numpy uint8 view of their bytes),
// combine_states (what they reduce with) and SequenceParallelStats.
//
// The C++ calls run with the GIL released; every method of the trampoline takes it back
// before it calls Python. A Python method works on copies that Python owns (a fresh array,
// a fresh StateBlock) which are copied back when it returns, so a reference kept past the
// call never points into freed memory. A Python exception raised by a method leaves the C++
// call as that exception.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"

namespace favor::python {
namespace {

class PyExchange : public Exchange {
 public:
  int rank() const override { PYBIND11_OVERRIDE_PURE(int, Exchange, rank, ); }
  int size() const override { PYBIND11_OVERRIDE_PURE(int, Exchange, size, ); }

  std::vector<int64_t> allgather(const std::vector<int64_t>& values) override {
    py::gil_scoped_acquire gil;
    py::array_t<int64_t> a(static_cast<py::ssize_t>(values.size()));
    std::copy(values.begin(), values.end(), a.mutable_data());
    const py::object r = method("allgather")(a);
    auto all = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(r);
    const auto want = static_cast<py::ssize_t>(values.size()) * size();
    if (!all || all.size() != want) {
      throw Error("Exchange.allgather: returned " + describe(r) + "; it must return the " +
                  std::to_string(want) + " integers of every rank's values in rank order");
    }
    return std::vector<int64_t>(all.data(), all.data() + all.size());
  }

  std::vector<std::string> allgather_text(const std::string& text) override {
    py::gil_scoped_acquire gil;
    const py::object s = py::reinterpret_steal<py::object>(
        PyUnicode_DecodeUTF8(text.data(), static_cast<py::ssize_t>(text.size()), "replace"));
    if (!s) throw py::error_already_set();
    const py::object r = method("allgather_text")(s);
    std::vector<std::string> all;
    try {
      all = r.cast<std::vector<std::string>>();
    } catch (const py::cast_error&) {
      all.clear();
    }
    if (static_cast<int>(all.size()) != size()) {
      throw Error("Exchange.allgather_text: returned " + describe(r) +
                  "; it must return a list of every rank's text (" + std::to_string(size()) +
                  " str) in rank order");
    }
    return all;
  }

  void allreduce_sum(double* data, int64_t n) override { sum(data, n); }
  void allreduce_sum(float* data, int64_t n) override { sum(data, n); }

  void allreduce_states(StateBlock& block) override {
    py::gil_scoped_acquire gil;
    const py::object copy = py::cast(StateBlock(block));
    method("allreduce_states")(copy);
    copy_back(copy, block, "allreduce_states");
  }

  void exscan_states(StateBlock& block, bool reverse) override {
    py::gil_scoped_acquire gil;
    const py::object copy = py::cast(StateBlock(block));
    method("exscan_states")(copy, reverse);
    copy_back(copy, block, "exscan_states");
  }

 private:
  /// The Python override of `name`; TypeError when the subclass lacks it.
  py::function method(const char* name) const {
    py::function f = py::get_override(static_cast<const Exchange*>(this), name);
    if (!f) {
      throw py::type_error(std::string("favor Exchange: the subclass does not implement ") + name +
                           "()");
    }
    return f;
  }

  static std::string describe(const py::handle& r) {
    return py::repr(r).cast<std::string>().substr(0, 200);
  }

  /// allreduce_sum over a fresh array: summed in place (the method returns None) or
  /// returned (an array of the same size, copied back).
  template <class T>
  void sum(T* data, int64_t n) {
    py::gil_scoped_acquire gil;
    py::array_t<T> a(static_cast<py::ssize_t>(n));
    if (n > 0) std::memcpy(a.mutable_data(), data, sizeof(T) * n);
    const py::object r = method("allreduce_sum")(a);
    py::array_t<T> result = a;
    if (!r.is_none()) {
      result = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(r);
      if (!result || result.size() != n) {
        throw Error("Exchange.allreduce_sum: returned " + describe(r) +
                    "; it must sum the array in place (and return None) or return the " +
                    std::to_string(n) + " sums");
      }
    }
    if (n > 0) std::memcpy(data, result.data(), sizeof(T) * n);
  }

  static void copy_back(const py::object& copy, StateBlock& block, const char* name) {
    const auto& out = copy.cast<const StateBlock&>();
    if (out.bytes() != block.bytes()) {
      throw Error(std::string("Exchange.") + name + ": the block changed its size");
    }
    if (block.bytes() > 0) std::memcpy(block.data(), out.data(), block.bytes());
  }
};

/// `obj` as a uint8 array (viewed, any strides); `writable`: the array is written in place,
/// so it must be writable and C-contiguous. `name` for the errors.
py::array_t<uint8_t> byte_array(const py::handle& obj, const char* name, bool writable) {
  py::array a = py::array::ensure(obj);
  if (!a) throw Error(std::string(name) + ": cannot be read as an array");
  if (!a.dtype().is(py::dtype::of<uint8_t>())) {
    throw Error(std::string(name) + ": dtype " + py::str(a.dtype()).cast<std::string>() +
                " must be uint8 (the bytes of StateBlock records)");
  }
  if (writable && !a.writeable()) {
    throw Error(std::string(name) + ": is read-only; it receives the combination in place");
  }
  if (writable && !(a.flags() & py::array::c_style)) {
    throw Error(std::string(name) + ": must be C-contiguous (it is written in place)");
  }
  return py::array_t<uint8_t>::ensure(a);
}

void combine(const py::handle& earlier_obj, const py::handle& later_obj, int64_t record_bytes) {
  if (record_bytes < 8 || record_bytes % 8 != 0) {
    throw Error("record_bytes: " + std::to_string(record_bytes) +
                " must be a positive multiple of 8 (StateBlock.record_bytes)");
  }
  const py::array_t<uint8_t> earlier = byte_array(earlier_obj, "earlier", false);
  py::array_t<uint8_t> later = byte_array(later_obj, "later", true);
  if (earlier.size() != later.size() || later.size() % record_bytes != 0) {
    throw Error("earlier, later: " + std::to_string(earlier.size()) + " and " +
                std::to_string(later.size()) + " bytes; both must hold the same whole records of " +
                std::to_string(record_bytes) + " bytes");
  }
  const int64_t count = later.size() / record_bytes;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  // Records hold doubles and floats: misaligned or strided bytes go through aligned copies.
  std::vector<uint64_t> e_copy, l_copy;
  const uint8_t* e = earlier.data();
  if (!aligned(e) || !(earlier.flags() & py::array::c_style)) {
    e_copy.resize(static_cast<size_t>(earlier.size() / 8));
    auto c = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(earlier);
    std::memcpy(e_copy.data(), c.data(), static_cast<size_t>(earlier.size()));
    e = reinterpret_cast<const uint8_t*>(e_copy.data());
  }
  uint8_t* l = later.mutable_data();
  const bool copy_later = !aligned(l);
  if (copy_later) {
    l_copy.resize(static_cast<size_t>(later.size() / 8));
    std::memcpy(l_copy.data(), l, static_cast<size_t>(later.size()));
    l = reinterpret_cast<uint8_t*>(l_copy.data());
  }
  {
    py::gil_scoped_release release;
    combine_states(e, l, count, record_bytes);
  }
  if (copy_later) std::memcpy(later.mutable_data(), l, static_cast<size_t>(later.size()));
}

}  // namespace

void bind_exchange(py::module_& m) {
  py::class_<Exchange, PyExchange>(m, "Exchange")
      .def(py::init<>())
      .def("rank", &Exchange::rank)
      .def("size", &Exchange::size);

  py::class_<StateBlock>(m, "StateBlock")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("heads"), py::arg("size"),
           py::arg("distance") = false)
      .def_property_readonly("heads", &StateBlock::heads)
      .def_property_readonly("size", &StateBlock::size)
      .def_property_readonly("distance", &StateBlock::distance)
      .def_property_readonly("record_bytes", &StateBlock::record_bytes)
      .def_property_readonly("nbytes", &StateBlock::bytes)
      .def_property_readonly("bytes",
                             [](py::object self) {
                               auto& b = self.cast<StateBlock&>();
                               return py::array_t<uint8_t>({b.bytes()}, {int64_t{1}}, b.data(),
                                                           self);
                             })
      .def("header",
           [](const StateBlock& b, int64_t head) {
             if (head < 0 || head >= b.heads()) {
               throw Error("head: " + std::to_string(head) + " must be in [0, " +
                           std::to_string(b.heads()) + ")");
             }
             const StateHeader& h = b.header(head);
             return py::make_tuple(h.max, h.length, h.size, h.distance);
           })
      .def("clear", &StateBlock::clear)
      .def("__repr__", [](const StateBlock& b) {
        return "favor._core.StateBlock(heads=" + std::to_string(b.heads()) +
               ", size=" + std::to_string(b.size()) +
               ", distance=" + (b.distance() ? "True" : "False") +
               ", record_bytes=" + std::to_string(b.record_bytes()) + ")";
      });

  m.def("combine_states", &combine, py::arg("earlier"), py::arg("later"), py::arg("record_bytes"));

  py::class_<SequenceParallelStats>(m, "SequenceParallelStats")
      .def_readonly("zero_rows", &SequenceParallelStats::zero_rows)
      .def_readonly("offset", &SequenceParallelStats::offset)
      .def_readonly("total", &SequenceParallelStats::total)
      .def_readonly("payload_bytes", &SequenceParallelStats::payload_bytes)
      .def_readonly("collectives", &SequenceParallelStats::collectives)
      .def("__repr__", [](const SequenceParallelStats& s) {
        return "SequenceParallelStats(zero_rows=" + std::to_string(s.zero_rows) +
               ", offset=" + std::to_string(s.offset) + ", total=" + std::to_string(s.total) +
               ", payload_bytes=" + std::to_string(s.payload_bytes) +
               ", collectives=" + std::to_string(s.collectives) + ")";
      });
}

}  // namespace favor::python
