// `dsmesh quantize --model IN --out OUT --bits experts=2,dense=6[,layer.13=3][,mtp=2][,head=6][,embed=fp8]
//  [--codebook mcg] [--force] [--shard-size-mb N] [--size-only]`; prints a summary line and the pack's size by
//  tensor class (experts, dense, head, embedding, other). --size-only computes that size from the shapes
//  without encoding or writing anything (no --out needed).
#include <cstdio>
#include <iostream>

#include "kernels/exl3/quantize_command.h"
#include "common/flags.h"
#include "kernels/exl3/parallel.h"
#include "kernels/exl3/quantize_checkpoint.h"
#include "kernels/exl3/viterbi.h"

namespace dsmesh {

int RunQuantize(const std::vector<std::string>& args) {
  Flags flags(args, {"model", "out", "bits", "codebook", "force", "shard-size-mb", "quiet", "size-only"},
              {"force", "quiet", "size-only"});
  QuantizeCheckpointOptions opt;
  opt.model_dir = flags.Require("model");
  opt.size_only = flags.GetBool("size-only", false);
  if (!opt.size_only) opt.out_dir = flags.Require("out");
  try {
    opt.bits = Exl3BitsSpec::Parse(flags.Require("bits"));
    opt.codebook = ParseExl3Codebook(flags.Get("codebook", "mcg"), "--codebook");
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  opt.force = flags.GetBool("force", false);
  opt.progress = !flags.GetBool("quiet", false);
  const long long shard_mb = flags.GetInt("shard-size-mb", 8192);
  if (shard_mb <= 0) throw UsageError("--shard-size-mb must be positive");
  opt.shard_bytes = shard_mb << 20;
  const QuantizeCheckpointSummary s = QuantizeCheckpoint(opt);
  if (opt.size_only) {
    std::printf("quantize --size-only: %s with %s would be a pack of %s (%lld bytes of tensors; safetensors headers "
                "add a few KB)\n",
                opt.model_dir.c_str(), opt.bits.ToString().c_str(), s.planned_bytes.ToString().c_str(),
                static_cast<long long>(s.planned_bytes.total()));
    return 0;
  }
  std::printf("quantize: %s -> %s: %lld linears to EXL3 (%s, %s, %.2f bits/weight average, %lld tiles), "
              "%lld tensors kept, %d shard(s), %.1f s on %d threads (%s Viterbi)\n",
              opt.model_dir.c_str(), opt.out_dir.c_str(), static_cast<long long>(s.tensors_quantized),
              opt.bits.ToString().c_str(), Exl3CodebookName(opt.codebook), s.average_bits,
              static_cast<long long>(s.tiles), static_cast<long long>(s.tensors_kept), s.shards, s.seconds,
              Exl3ThreadCount(), Exl3EncoderCanUseAvx512() ? "AVX-512" : "AVX2");
  std::printf("quantize: pack size %s (%lld bytes of tensors, %lld bytes of safetensors files)\n",
              s.bytes.ToString().c_str(), static_cast<long long>(s.bytes.total()), static_cast<long long>(s.file_bytes));
  return 0;
}

}  // namespace dsmesh
