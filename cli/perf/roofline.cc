#include "cli/perf/roofline.h"

#include <cmath>
#include <cstdio>

#include "kernels/exl3/decode_cost.h"

namespace dsmesh {

DecodeStepFloor ComputeDecodeStepFloor(const ModelConfig& c, const Exl3BitsSpec& bits, const DecodeStepShape& s,
                                       const RooflineCeilings& ceil) {
  DecodeStepFloor f;
  const double N = s.world, D = static_cast<double>(c.hidden_size), d = c.head_dim, H = c.num_heads;
  const double ql = c.q_lora_rank, ol = c.o_lora_rank, G = c.o_groups, hi = c.index_n_heads, di = c.index_head_dim;
  const double E = c.n_routed_experts, k = c.num_experts_per_tok, I = static_cast<double>(c.moe_intermediate_size);
  const int rows = s.streams * s.rows_per_stream;
  const double R = rows;
  // A linear of `weights` weights (this rank's part), quantized at K bits or kept in bf16 (K = 0).
  auto dense = [&](double weights, int K, int linear_rows) {
    if (K <= 0) {
      f.small_bytes += 2 * weights;
      return;
    }
    f.dense_bytes += weights * K / 8.0;
    f.exl3_weights += weights;
    f.dense_ops += weights * Exl3DecodeOpsPerWeight(K, linear_rows);
  };
  const KvLayout kv = ComputeKvLayout(c, s.kv, /*with_mtp=*/false);
  f.expected_experts_per_layer = E * (1.0 - std::pow(1.0 - k / E, R));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto K = [&](const std::string& name) { return PlanExl3Tensor(p + name + ".weight", bits).K; };
    const AttentionKind kind = c.attention_kind(l);
    const int ratio = c.compress_ratio(l);
    dense(ql * D, K("attn.wq_a"), rows);
    dense(H * d * ql / N, K("attn.wq_b"), rows);
    dense(d * D, K("attn.wkv"), rows);
    dense(G * ol * (H / G) * d / N, K("attn.wo_a"), rows);
    dense(D * G * ol / N, K("attn.wo_b"), rows);
    if (kind != AttentionKind::kSliding) {
      const double cm = kind == AttentionKind::kCompressedSparse ? 2 : 1;
      dense(cm * d * D, K("attn.compressor.wkv"), rows);
      dense(cm * d * D, K("attn.compressor.wgate"), rows);
    }
    if (kind == AttentionKind::kCompressedSparse) {
      dense(hi * di * ql, K("attn.indexer.wq_b"), rows);
      dense(hi * D, K("attn.indexer.weights_proj"), rows);
      dense(2 * di * D, K("attn.indexer.compressor.wkv"), rows);
      dense(2 * di * D, K("attn.indexer.compressor.wgate"), rows);
    }
    if (c.n_shared_experts > 0) {
      dense(2 * I * D / N, K("ffn.shared_experts.w1"), rows);
      dense(I * D / N, K("ffn.shared_experts.w2"), rows);
    }
    dense(E * D, 0, rows);  // router, bf16
    f.small_bytes += 2.0 * 4 * (2 + c.hc_mult) * c.hc_mult * c.hc_mult * D;  // hc_attn/hc_ffn fn, f32
    // Routed experts: each expected expert's gate, up and down (this rank's slice), about one row each.
    const int Ke = PlanExl3Tensor(p + "ffn.experts.0.w1.weight", bits).K;
    const double expert_weights = f.expected_experts_per_layer * 3 * D * I / N;
    if (Ke > 0) {
      f.expert_bytes += expert_weights * Ke / 8.0;
      f.exl3_weights += expert_weights;
      f.expert_ops += expert_weights * Exl3DecodeOpsPerWeight(Ke, 1);
    } else {
      f.expert_bytes += 2 * expert_weights;
    }
    // KV read per sequence: the window, the selected (CSA) or all (HCA) entries, every indexer key.
    const double L = static_cast<double>(s.context);
    double kv_rows = std::min<double>(L, c.sliding_window) * kv.window_row_bytes;
    if (kind == AttentionKind::kCompressedSparse)
      kv_rows += std::min<double>(c.index_topk, std::floor(L / ratio)) * kv.entry_bytes +
                 std::floor(L / ratio) * kv.indexer_key_bytes;
    if (kind == AttentionKind::kHeavilyCompressed) kv_rows += std::floor(L / ratio) * kv.entry_bytes;
    f.kv_bytes += s.streams * kv_rows;
  }
  const int Kh = PlanExl3Tensor("head.weight", bits).K;
  const double head_weights = static_cast<double>(c.vocab_size) * D / N;
  if (Kh > 0) {
    f.head_bytes += head_weights * Kh / 8.0;
    f.exl3_weights += head_weights;
    f.head_ops += head_weights * Exl3DecodeOpsPerWeight(Kh, rows);
  } else {
    f.head_bytes += 2 * head_weights;
  }
  f.decode_ops = f.dense_ops + f.expert_ops + f.head_ops;
  f.byte_floor_s = f.bytes() / ceil.copy_bytes_per_s;
  f.op_floor_s = f.decode_ops / ceil.int_ops_per_s;
  return f;
}

std::string DecodeStepFloor::Describe() const {
  char line[512];
  std::snprintf(line, sizeof(line),
                "reads %.2f GB (dense %.2f, experts %.2f [%.1f/layer], head %.2f, bf16/f32 %.2f, KV %.3f), "
                "EXL3 decode %.2f G weights -> byte floor %.3f ms, op floor %.3f ms",
                bytes() / 1e9, dense_bytes / 1e9, expert_bytes / 1e9, expected_experts_per_layer, head_bytes / 1e9,
                small_bytes / 1e9, kv_bytes / 1e9, exl3_weights / 1e9, byte_floor_s * 1e3, op_floor_s * 1e3);
  return line;
}

}  // namespace dsmesh
