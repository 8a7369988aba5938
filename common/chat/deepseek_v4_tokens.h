// Marker strings of the DeepSeek-V4 chat format; each is one special token of the V4 tokenizer.
#pragma once

namespace dsmesh::dsv4 {

inline constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
inline constexpr char kEos[] = "<｜end▁of▁sentence｜>";
inline constexpr char kUser[] = "<｜User｜>";
inline constexpr char kAssistant[] = "<｜Assistant｜>";
inline constexpr char kThinkStart[] = "<think>";
inline constexpr char kThinkEnd[] = "</think>";
inline constexpr char kDsml[] = "｜DSML｜";
inline constexpr char kToolCallsOpen[] = "<｜DSML｜tool_calls>";
inline constexpr char kToolCallsClose[] = "</｜DSML｜tool_calls>";
// DeepSeek-V3.2's name for the same block (its encoder writes "function_calls"; V4's writes "tool_calls").
inline constexpr char kFunctionCallsOpen[] = "<｜DSML｜function_calls>";
inline constexpr char kFunctionCallsClose[] = "</｜DSML｜function_calls>";
// Any DSML tag: "<" or "</" followed by this.
inline constexpr char kDsmlTagOpen[] = "<｜DSML｜";
inline constexpr char kDsmlTagClose[] = "</｜DSML｜";
inline constexpr char kInvokeOpen[] = "<｜DSML｜invoke";
inline constexpr char kInvokeClose[] = "</｜DSML｜invoke>";
inline constexpr char kParameterOpen[] = "<｜DSML｜parameter";
inline constexpr char kParameterClose[] = "</｜DSML｜parameter>";

}  // namespace dsmesh::dsv4
