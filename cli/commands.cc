// The table of `dsmesh` commands, and the dispatch that picks between layers for `logits` / `generate`: in
// this process (cli/model_commands/) or on a mesh (cli/mesh_commands.h). It lives here so that model/ needs nothing from
// the mesh side and no command looks another up by name. (`bench` picks its mode in cli/bench/bench_mode.cc.)
#include "cli/commands.h"

#include "cli/bench/bench_command.h"
#include "cli/mesh_commands.h"
#include "cli/model_commands/model_commands.h"
#include "cli/perf/reference_deployment_projection_command.h"
#include "common/chat/chat_prompt_command.h"
#include "common/tokenizer/tokenizer_commands.h"
#include "kernels/exl3/exl3_check_command.h"
#include "kernels/exl3/quantize_command.h"

namespace dsmesh {
namespace {

bool HasFlag(const std::vector<std::string>& args, const char* flag) {
  for (const auto& a : args)
    if (a.rfind(flag, 0) == 0) return true;
  return false;
}

// --world N / --coordinator HOST:PORT run the command on a mesh instead of in this process.
bool WantsMesh(const std::vector<std::string>& args) {
  return HasFlag(args, "--world") || HasFlag(args, "--coordinator");
}

CommandFn InProcessOrMesh(CommandFn in_process, CommandFn mesh) {
  return [in_process, mesh](const std::vector<std::string>& args) {
    return WantsMesh(args) ? mesh(args) : in_process(args);
  };
}

constexpr char kDeviceFlag[] = "[--device cpu|cuda[:N] (default: a CUDA GPU when one is visible)]";

std::map<std::string, CommandInfo> BuildTable() {
  const std::string device = kDeviceFlag;
  return {
      {"up",
       {"up [--model DIR] [--world N (default 1 on a GPU, 2 on the CPU)] [--port 8000] " + device +
            " [--kv-memory 1G | --gpu-memory-utilization 0.9] [--threads T] "
            "[--max-num-seqs 4] [--max-num-batched-tokens 512] [--max-model-len L] "
            "[--long-prefill-token-threshold 128] [--max-decode-slowdown R] [--scheduling-policy fcfs|priority] "
            "[--speculative-config '{\"method\":\"mtp\",\"num_speculative_tokens\":3}'] "
            "[--draft-policy adaptive|fixed] [--no-gateway] "
            "[--served-model-name NAME] [--api-key KEY | --api-key-file F] [--max-queued N] [--log-dir DIR]",
        RunUp}},
      {"bench",
       {"bench --coordinator HOST:PORT | --world N --model DIR [--streams 1,4] "
        "[--prompt-tokens 32] [--max-tokens 64] [--repeat N] [--json F] [--speculative-config "
        "'{\"method\":\"mtp\",\"num_speculative_tokens\":3}' (with --world: on and off in one "
        "run) [--draft-acceptance 0.85,0.70,0.55 (simulated acceptance, bench only)]]\n"
        "  scenario: bench --scenario long-prompt-plus-chat [--world 2] [--model DIR] "
        "[--long-prompt-tokens 16384] [--chat-every-s 1] [--max-decode-slowdown R (adds a fair + cap column)] "
        "[--json F]\n"
        "  in this process: bench --device cpu|cuda[:N] --model DIR|synthetic:v4-flash [--streams 1,4] "
        "[--contexts 4096] [--rows 1] [--steps 20] [--prefill-chunk 512] [--speculative-tokens K] [--bits experts=2,dense=6] [--json F] "
        "[--enforce-eager] "
        "[--profile: time every op with device events in extra eager steps and print "
        "the split per phase] [--timeline [--timeline-steps 4]: trace steps with CUPTI (cuda): device busy and "
        "idle, the idle gaps by cause]\n"
        "  HTTP: bench --url http://HOST:PORT [--model NAME] [--max-tokens 256] [--streams 1,4] "
        "[--prompts en,ja,code] [--runs N] [--thinking true|false] [--api-key K] [--json FILE]\n"
        "  HTTP load: bench --url http://HOST:PORT --clients 64 [--requests N] [--max-tokens 64] "
        "[--prompt-words 32] [--long-prompt-bytes B [--long-prompts K]] [--timeout-s 600] [--json FILE]",
        RunBench}},
      {"logits",
       {"logits --model DIR --tokens 5,17,9 --out FILE.safetensors " + device +
            " [--threads N] [--world N | --coordinator HOST:PORT]",
        InProcessOrMesh(RunLogits, RunLogitsMesh)}},
      {"generate",
       {"generate --model DIR --tokens 5,17,9 --max-new-tokens N [--ignore-eos] " + device +
            " [--threads N] [--world N | --coordinator HOST:PORT]",
        InProcessOrMesh(RunGenerate, RunGenerateMesh)}},
      {"make-tiny",
       {"make-tiny --out DIR [--seed S] [--vision] [--mtp-layers N] [--vocab V] [--sliding-layers N]", RunMakeTiny}},
      {"ppl",
       {"ppl --model DIR|--url http://HOST:PORT --file F [--ctx 512] [--chunks N] [--threads N] "
        "[--device cpu|cuda] [--tokenizer DIR] [--api-key K] [--timeout-s 600]",
        RunPpl}},
      {"project-reference",
       {"project-reference --profile BENCH.json [--bits experts=2,dense=6]: the H200 decode profile of the "
        "full-size V4-Flash projected onto the reference deployment (vLLM + exllamav3 on 8 x RTX PRO 2000, TP8)",
        RunProjectReference}},
      // The same command under the reference deployment's project name, "the seat".
      {"project-seat",
       {"project-seat --profile BENCH.json [--bits experts=2,dense=6]: project-reference under its other name "
        "(\"the seat\" is the reference deployment)",
        RunProjectReference}},
      {"tokenize", {"tokenize --tokenizer DIR --text-file F [--add-special-tokens]", RunTokenize}},
      {"detokenize", {"detokenize --tokenizer DIR --ids 1,2,3 [--skip-special-tokens]", RunDetokenize}},
      {"chat-prompt",
       {"chat-prompt --tokenizer DIR --messages FILE.json [--thinking true|false] [--tools FILE.json] "
        "[--format v4|v3] [--add-generation-prompt true|false]",
        RunChatPrompt}},
      {"quantize",
       {"quantize --model IN_DIR --out OUT_DIR --bits experts=2,dense=6[,layer.13=3][,mtp=2][,head=6][,embed=fp8] "
        "[--codebook mcg|mul1|3inst] [--force] [--shard-size-mb 8192] [--quiet] [--size-only]",
        RunQuantize}},
      {"exl3-check", {"exl3-check --vectors FILE.safetensors", RunExl3Check}},
  };
}

}  // namespace

const std::map<std::string, CommandInfo>& CommandRegistry() {
  static const auto* table = new std::map<std::string, CommandInfo>(BuildTable());
  return *table;
}

}  // namespace dsmesh
