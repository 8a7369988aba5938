#include "cli/bench/step_profile.h"

#include <algorithm>
#include <string>
#include <vector>

namespace dsmesh {

nlohmann::json PrintOpBytes(const OpProfile& p, std::FILE* out, int rows) {
  if (p.ops.empty() || p.steps == 0) return nlohmann::json::object();
  const double steps = static_cast<double>(p.steps), peak = p.peak_bytes_per_s;
  nlohmann::json j = {{"peak_bytes_per_s", peak}, {"peak_source", p.peak_source}, {"steps", p.steps}};
  std::fprintf(out, "  bytes per op (each op's device time alone, from the isolated pass; peak %.2f TB/s from %s):\n",
               peak / 1e12, p.peak_source.c_str());
  std::fprintf(out, "  %-78s %7s %12s %10s %9s %8s\n", "op", "calls", "bytes/call", "device us", "GB/s", "% peak");
  std::vector<const OpTiming*> ops;
  for (const OpTiming& t : p.ops) ops.push_back(&t);
  std::stable_sort(ops.begin(), ops.end(), [](const OpTiming* a, const OpTiming* b) { return a->ms > b->ms; });
  double bytes = 0, ms = 0, counted_ms = 0, rest_bytes = 0, rest_ms = 0;
  int shown = 0, rest = 0;
  for (const OpTiming* t : ops) {
    const double us = t->calls ? 1e3 * t->ms / t->calls : 0, per_call = t->calls ? t->bytes / t->calls : 0;
    const double bytes_per_s = t->ms > 0 ? t->bytes / (t->ms * 1e-3) : 0;
    nlohmann::json o = {{"op", t->op},
                        {"calls_per_step", t->calls / steps},
                        {"bytes_per_call", per_call},
                        {"bytes_per_step", t->bytes / steps},
                        {"device_us_per_call", us}};
    if (t->bytes > 0 && t->ms > 0) {
      o["gb_per_s"] = bytes_per_s / 1e9;
      if (peak > 0) o["percent_of_peak"] = 100 * bytes_per_s / peak;
    }
    j["ops"].push_back(o);
    bytes += t->bytes;
    ms += t->ms;
    if (t->bytes > 0) counted_ms += t->ms;
    if (shown < rows) {
      ++shown;
      if (t->bytes > 0)
        std::fprintf(out, "  %-78s %7.1f %12.0f %10.1f %9.1f %7.1f%%\n", t->op.c_str(), t->calls / steps, per_call, us,
                     bytes_per_s / 1e9, peak > 0 ? 100 * bytes_per_s / peak : 0.0);
      else
        std::fprintf(out, "  %-78s %7.1f %12s %10.1f %9s %8s\n", t->op.c_str(), t->calls / steps, "-", us, "-", "-");
    } else {
      ++rest;
      rest_bytes += t->bytes;
      rest_ms += t->ms;
    }
  }
  if (rest > 0)
    std::fprintf(out, "  (%d more ops: %.0f bytes, %.3f ms per step)\n", rest, rest_bytes / steps, rest_ms / steps);
  const double all_per_s = ms > 0 ? bytes / (ms * 1e-3) : 0;
  std::fprintf(out, "  all ops: %.4f GB per step in %.3f ms of device work alone: %.1f GB/s, %.1f%% of peak (ops "
               "with bytes counted: %.3f ms of it)\n",
               bytes / steps / 1e9, ms / steps, all_per_s / 1e9, peak > 0 ? 100 * all_per_s / peak : 0.0,
               counted_ms / steps);
  j["bytes_per_step"] = bytes / steps;
  j["device_ms_per_step"] = ms / steps;
  j["counted_ms_per_step"] = counted_ms / steps;
  j["gb_per_s"] = all_per_s / 1e9;
  if (peak > 0) j["percent_of_peak"] = 100 * all_per_s / peak;
  return j;
}

StepGraphProfile TraceDecodeGraphs(Backend& backend, const std::function<void()>& step, int replays, int attempts) {
  backend.TraceStepGraphs(true);
  StepGraphProfile traced;
  try {
    for (int i = 0; i < attempts; ++i) {
      step();
      traced = backend.TakeStepGraphs(0);
      const bool settled = traced.captures == 0 && traced.eager_segments == 0;
      // Two steps without a graph or a capture: graphs are off (--enforce-eager), not yet to be recorded.
      const bool no_graphs = traced.graphs.empty() && traced.captures == 0 && i > 0;
      if (settled || no_graphs) break;
    }
    if (!traced.graphs.empty() && replays > 0) traced = backend.TakeStepGraphs(replays);
  } catch (...) {
    backend.TraceStepGraphs(false);
    throw;
  }
  backend.TraceStepGraphs(false);
  return traced;
}

nlohmann::json PrintStepGraphs(const StepGraphProfile& g, double step_ms, std::FILE* out) {
  if (g.graphs.empty()) {
    if (g.eager_segments == 0 && g.captures == 0)
      std::fprintf(out, "  step graphs: none (this backend records no graphs)\n");
    else
      std::fprintf(out, "  step graphs: the traced step replayed no graph (%lld segments ran eagerly)\n",
                   static_cast<long long>(g.eager_segments));
    return nlohmann::json::object();
  }
  GraphShape all;
  for (const StepGraph& s : g.graphs) {
    all.nodes += s.shape.nodes;
    all.kernels += s.shape.kernels;
    all.memcpys += s.shape.memcpys;
    all.memsets += s.shape.memsets;
    all.other += s.shape.other;
    all.chain += s.shape.chain;
  }
  const StepGraphProfile::LayerSplit l = g.SplitByLayer();
  const double per_layer_nodes = l.layers ? static_cast<double>(l.layer_nodes) / l.layers : 0;
  const double per_layer_chain = l.layers ? static_cast<double>(l.layer_chain) / l.layers : 0;
  std::fprintf(out, "  step graphs: %zu graphs replayed per step, %lld nodes (%lld kernels, %lld copies, %lld sets, "
               "%lld other), %lld dependent nodes (the graphs' longest chains, summed)\n",
               g.graphs.size(), static_cast<long long>(all.nodes), static_cast<long long>(all.kernels),
               static_cast<long long>(all.memcpys), static_cast<long long>(all.memsets),
               static_cast<long long>(all.other), static_cast<long long>(all.chain));
  std::fprintf(out, "  per layer (%d layers): %.1f nodes, %.1f dependent; outside the layers: %lld nodes, %lld "
               "dependent; segments run eagerly in the traced step: %lld\n",
               l.layers, per_layer_nodes, per_layer_chain, static_cast<long long>(l.other_nodes),
               static_cast<long long>(l.other_chain), static_cast<long long>(g.eager_segments));
  nlohmann::json j = {{"graphs", g.graphs.size()},
                      {"nodes", all.nodes},
                      {"kernels", all.kernels},
                      {"memcpys", all.memcpys},
                      {"memsets", all.memsets},
                      {"other_nodes", all.other},
                      {"dependent_nodes", all.chain},
                      {"layers", l.layers},
                      {"nodes_per_layer", per_layer_nodes},
                      {"dependent_nodes_per_layer", per_layer_chain},
                      {"nodes_outside_layers", l.other_nodes},
                      {"dependent_nodes_outside_layers", l.other_chain},
                      {"eager_segments", g.eager_segments},
                      {"step_ms", step_ms}};
  if (g.replays > 0) {
    std::fprintf(out, "  the step's graphs replayed back to back (%d times): %.3f ms/step as recorded, %.3f ms/step "
                 "with empty kernels and 1-byte copies (the chain alone: %.2f us per dependent node); the step as "
                 "timed above: %.3f ms%s\n",
                 g.replays, g.replay_ms, g.chain_ms, all.chain ? 1e3 * g.chain_ms / all.chain : 0.0, step_ms,
                 g.kept_nodes ? (", " + std::to_string(g.kept_nodes) + " nodes could not be emptied").c_str()
                              : "");
    j["replays"] = g.replays;
    j["replay_ms"] = g.replay_ms;
    j["chain_ms"] = g.chain_ms;
    j["chain_us_per_dependent_node"] = all.chain ? 1e3 * g.chain_ms / all.chain : 0.0;
    j["kept_nodes"] = g.kept_nodes;
  }
  return j;
}

}  // namespace dsmesh
