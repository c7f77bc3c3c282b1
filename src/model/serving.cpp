// Serving budget (mode infer): filled in by the serving model.
#include "korthikanti.hpp"

namespace membudget::detail {
void predict_infer(Budget&, const PredictOptions&) {
  throw Error(ErrorKind::unsupported, "--mode infer: not implemented yet");
}
}  // namespace membudget::detail
