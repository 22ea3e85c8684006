// The data sets train_cfg trains on, in plain floats: small enough that
// every rank holds all of it, so sampling is an index computation that
// every rank repeats identically (no data loader, no shuffling service).
#include "lib/models/data.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

namespace dtrun::train {

// sklearn's digits.csv.gz: 64 pixel values (0..16) and the label per line.
// Pixels are scaled to [0, 1], as sklearn's examples do.
Result<Dataset> LoadDigits(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    return Status::Invalid("cannot open digits data '" + path +
                           "' (Debian package python3-sklearn ships it)");
  }
  Dataset d;
  d.features = 64;
  d.classes = 10;
  char line[4096];
  int line_no = 0;
  while (gzgets(f, line, sizeof(line))) {
    ++line_no;
    std::stringstream ss(line);
    std::string cell;
    std::vector<float> row;
    while (std::getline(ss, cell, ','))
      row.push_back(std::strtof(cell.c_str(), nullptr));
    if (row.size() != 65) {
      gzclose(f);
      return Status::Invalid(path + ":" + std::to_string(line_no) +
                             ": expected 65 columns, got " +
                             std::to_string(row.size()));
    }
    for (int i = 0; i < 64; ++i) d.x.push_back(row[i] / 16.0f);
    d.y.push_back(static_cast<int64_t>(row[64]));
  }
  gzclose(f);
  if (d.rows() == 0) return Status::Invalid(path + ": no rows");
  return d;
}

// Gaussian clusters around class centres spread twice as wide as the noise:
// separable, but not in a single step. Classes take turns, so any prefix is
// balanced.
Dataset MakeSynthetic(int samples, int features, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> centers(static_cast<size_t>(classes * features));
  for (auto& c : centers) c = 2.f * normal(rng);
  Dataset d;
  d.features = features;
  d.classes = classes;
  for (int i = 0; i < samples; ++i) {
    int c = i % classes;
    for (int j = 0; j < features; ++j)
      d.x.push_back(centers[c * features + j] + normal(rng));
    d.y.push_back(c);
  }
  return d;
}

// Every k-th row of each class goes to the test set: no randomness, so
// every rank and every run agree on the split without talking to each
// other, and a class with k rows or more is on both sides whatever order the
// rows come in (every k-th row overall, with the synthetic set's class
// i % classes in row i, 100 classes and k = 4, held out only classes 3, 7,
// ..., 99, which training then never saw).
void SplitTrainTest(const Dataset& all, double test_fraction, Dataset* train,
                    Dataset* test) {
  size_t every = test_fraction > 0
                     ? static_cast<size_t>(std::lround(1.0 / test_fraction))
                     : 0;
  for (Dataset* d : {train, test}) {
    *d = Dataset();
    d->features = all.features;
    d->classes = all.classes;
  }
  std::map<int64_t, size_t> seen;  // rows of each class so far
  for (size_t i = 0; i < all.rows(); ++i) {
    size_t n = seen[all.y[i]]++;
    Dataset* to = every && n % every == every - 1 ? test : train;
    to->x.insert(to->x.end(), all.x.begin() + i * all.features,
                 all.x.begin() + (i + 1) * all.features);
    to->y.push_back(all.y[i]);
  }
}

// A pure function of the step: the sampler keeps no state, so a run resumed
// at step s draws exactly the batches of an unbroken one. All ranks shuffle
// with the same seed per epoch and rank r takes its slice of the global
// batch, so no sample is seen twice in a step. Without drop_last the last
// batch of an epoch wraps around to its start.
std::vector<int64_t> StepIndices(size_t rows, int batch, int world, int rank,
                                 int64_t step, uint64_t seed, bool drop_last) {
  int64_t global = static_cast<int64_t>(batch) * world;
  int64_t n = static_cast<int64_t>(rows);
  int64_t per_epoch =
      std::max<int64_t>(1, drop_last ? n / global : (n + global - 1) / global);
  int64_t epoch = step / per_epoch, pos = step % per_epoch;
  std::vector<int64_t> perm(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(epoch));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch; ++i) {
    out.push_back(perm[static_cast<size_t>((pos * global + rank * batch + i) %
                                           static_cast<int64_t>(rows))]);
  }
  return out;
}

}  // namespace dtrun::train
