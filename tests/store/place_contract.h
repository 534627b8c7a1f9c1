#pragma once
// PlaceContract: the fixture of a contract suite whose parameter makes a fresh place to test on
// (a place to lock, a store to open work signals on), one per test, in `place_`.

#include <gtest/gtest.h>

#include <functional>

namespace minions {

template <typename Place>
class PlaceContract : public ::testing::TestWithParam<std::function<Place()>> {
 protected:
  void SetUp() override { place_ = this->GetParam()(); }
  Place place_;
};

}  // namespace minions
