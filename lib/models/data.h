#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/util/status.h"

namespace dtrun::train {

// A classification data set in row-major floats.
struct Dataset {
  std::vector<float> x;    // rows x features
  std::vector<int64_t> y;  // rows
  int features = 0, classes = 0;
  size_t rows() const { return y.size(); }
};

// sklearn's digits.csv.gz (64 pixel columns 0..16 then the label), pixels
// scaled to [0, 1]. Errors name the file and the line.
Result<Dataset> LoadDigits(const std::string& path);

// A seeded synthetic task: Gaussian blobs, one per class.
Dataset MakeSynthetic(int samples, int features, int classes, uint64_t seed);

// Deterministic split: every k-th row (k = round(1/test_fraction)) is held out.
void SplitTrainTest(const Dataset& all, double test_fraction, Dataset* train,
                    Dataset* test);

// Row indices of step `step` for `rank`: each epoch is a permutation of the
// training rows seeded by (seed, epoch); a step takes world*batch rows of it,
// rank r the r-th block of batch. The epoch's remainder is dropped
// (drop_last) or its last step is padded with rows from the epoch's start.
// A pure function of its arguments, so a resumed run sees the same data.
std::vector<int64_t> StepIndices(size_t rows, int batch, int world, int rank,
                                 int64_t step, uint64_t seed,
                                 bool drop_last = true);

}  // namespace dtrun::train
