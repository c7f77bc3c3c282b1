// attribute_snapshot(): decode, predict when a model is given, attribute.
#include "attribute_internal.hpp"
#include "membudget/attribute.hpp"

namespace membudget {
namespace {

Attribution run(const diagnose::DecodedSnapshot& snap, const AttributeOptions& options) {
  if (!options.model) return diagnose::attribute_decoded(snap, nullptr, options.job);
  PredictOptions po;
  po.explain = true;
  const Budget budget = predict(*options.model, options.job, po);
  return diagnose::attribute_decoded(snap, &budget, options.job);
}

}  // namespace

Attribution attribute_snapshot(std::string pickle_bytes, const std::string& where, const AttributeOptions& options) {
  const auto snap = diagnose::decode_snapshot(diagnose::parse_pickle(std::move(pickle_bytes), where), where);
  return run(snap, options);
}

Attribution attribute_snapshot_file(const std::string& path, const AttributeOptions& options) {
  const auto snap = diagnose::read_snapshot_file(path);
  return run(snap, options);
}

}  // namespace membudget
