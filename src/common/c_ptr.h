#pragma once
// CPtr: a std::unique_ptr to an object of a C library, freed by that library's function, e.g.
// CPtr<X509, X509_free>. One deleter for every such type, instead of a struct each.

#include <memory>

namespace minions {

template <typename T, auto Free>
struct FreeWith {
  void operator()(T* object) const { Free(object); }
};

template <typename T, auto Free>
using CPtr = std::unique_ptr<T, FreeWith<T, Free>>;

}  // namespace minions
