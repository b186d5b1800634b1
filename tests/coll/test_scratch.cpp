// The schedules' staging buffers (coll/scratch.hpp): a buffer comes back to the next call
// once its stage is gone, not while a view of it lives, and the keep holds a few at most.
// Each case starts from an empty keep (release_scratch, as destroy_process_group leaves it).
#define BOOST_TEST_MODULE shmdist scratch
#include <boost/test/unit_test.hpp>

#include <vector>

#include "coll/scratch.hpp"
#include "coll/tensor_views.hpp"

using namespace shmdist;
using namespace shmdist::coll;

BOOST_AUTO_TEST_SUITE(scratch_keep)

BOOST_AUTO_TEST_CASE(a_stage_comes_back_to_the_next_call_once_no_view_of_it_lives) {
  release_scratch();
  const void* first = nullptr;
  Tensor view;
  {
    Tensor stage = scratch(3000, kFloat32);
    first = stage.data_ptr();
    view = view_of(stage, 1000, 10);  // a receive into it that outlives its call
  }
  // The view holds it: the next call gets other memory, and the view's bytes stay its own.
  Tensor second = scratch(3000, kFloat32);
  const void* other = second.data_ptr();
  BOOST_TEST(other != first);
  view = Tensor();
  second = Tensor();
  if (!kScratchKept) return;  // under AddressSanitizer: every stage malloc'd and freed
  // Both are kept now: two calls of that size get the two of them again.
  const Tensor a = scratch(3000, kFloat32);
  const Tensor b = scratch(3000, kFloat32);
  BOOST_TEST(((a.data_ptr() == first && b.data_ptr() == other) ||
              (a.data_ptr() == other && b.data_ptr() == first)));
}

BOOST_AUTO_TEST_CASE(a_call_gets_the_smallest_kept_buffer_that_fits_and_the_keep_holds_four) {
  if (!kScratchKept) return;  // under AddressSanitizer: every stage malloc'd and freed
  // Five stages of 1-5 KiB given back: the keep holds four and frees the smallest (1 KiB).
  release_scratch();
  std::vector<const void*> at;
  {
    std::vector<Tensor> stages;
    for (int kib = 1; kib <= 5; ++kib) {
      stages.push_back(scratch(kib * 1024, kUInt8));
      at.push_back(stages.back().data_ptr());
    }
  }
  // 1 KiB: the 2 KiB buffer, the smallest kept that fits; 3 KiB: the 3 KiB one.
  Tensor small = scratch(1024, kUInt8);
  BOOST_TEST(small.data_ptr() == at[1]);
  Tensor three = scratch(3 * 1024, kUInt8);
  BOOST_TEST(three.data_ptr() == at[2]);
  // 6 KiB fits none of those left (4 and 5 KiB): new memory.
  Tensor six = scratch(6 * 1024, kUInt8);
  BOOST_TEST(six.data_ptr() != at[3]);
  BOOST_TEST(six.data_ptr() != at[4]);
}

BOOST_AUTO_TEST_CASE(the_keep_holds_64_mib_at_most_the_largest_first) {
  if (!kScratchKept) return;  // under AddressSanitizer: every stage malloc'd and freed
  release_scratch();
  std::vector<const void*> at;
  {
    std::vector<Tensor> stages;
    for (const std::int64_t mib : {8, 40, 24}) {  // 72 MiB together
      stages.push_back(scratch(mib << 20, kUInt8));
      at.push_back(stages.back().data_ptr());
    }
  }
  // The 8 MiB one went (the smallest): 64 MiB kept. 1 MiB gets the 24 MiB buffer, then 30 MiB
  // the 40 MiB one.
  Tensor one = scratch(1 << 20, kUInt8);
  BOOST_TEST(one.data_ptr() == at[2]);
  Tensor thirty = scratch(30 << 20, kUInt8);
  BOOST_TEST(thirty.data_ptr() == at[1]);
  // A buffer larger than the whole keep is not kept.
  const void* huge = nullptr;
  {
    Tensor big = scratch((std::int64_t{64} << 20) + 1, kUInt8);
    huge = big.data_ptr();
  }
  Tensor small = scratch(4096, kUInt8);
  BOOST_TEST(small.data_ptr() != huge);
}

BOOST_AUTO_TEST_SUITE_END()
