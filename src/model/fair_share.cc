#include "model/fair_share.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace minions {

absl::Duration DecayUsage(absl::Duration usage, absl::Time at, absl::Time now, absl::Duration half_life) {
  if (now <= at || half_life <= absl::ZeroDuration()) return usage;
  const double halvings = absl::FDivDuration(now - at, half_life);
  return usage * std::exp2(-halvings);
}

std::map<std::string, int> FairShareRanks(const std::vector<TeamUsage>& teams) {
  std::vector<const TeamUsage*> order;
  for (const TeamUsage& t : teams) order.push_back(&t);
  auto key = [](const TeamUsage* t) {
    const double weight = static_cast<double>(std::max<int64_t>(t->weight, 1));
    return std::make_tuple(absl::ToDoubleSeconds(t->usage) / weight, static_cast<double>(t->running) / weight,
                           t->team);
  };
  std::sort(order.begin(), order.end(), [&](const TeamUsage* a, const TeamUsage* b) { return key(a) < key(b); });
  std::map<std::string, int> ranks;
  int next = 0;
  for (const TeamUsage* t : order) {
    const bool full = t->max_running_tasks > 0 && t->running >= t->max_running_tasks;
    ranks[t->team] = full ? -1 : next++;
  }
  return ranks;
}

std::map<std::string, double> TargetShares(const std::vector<TeamUsage>& teams) {
  double total = 0;
  for (const TeamUsage& t : teams) total += static_cast<double>(std::max<int64_t>(t.weight, 1));
  std::map<std::string, double> shares;
  for (const TeamUsage& t : teams) {
    shares[t.team] = total > 0 ? static_cast<double>(std::max<int64_t>(t.weight, 1)) / total : 0;
  }
  return shares;
}

}  // namespace minions
