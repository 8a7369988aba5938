// UTF-8 helpers for the tokenizer: strict validation of input text (with the offset of the first bad
// byte) and lossy decoding of token bytes, which may split a character across tokens or be garbage
// when a model emits odd ids. Lossy decoding replaces each maximal invalid subpart with U+FFFD, the
// rule shared by the WHATWG TextDecoder (the JS reference) and Rust's from_utf8_lossy (HF tokenizers).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsmesh::utf8 {

inline constexpr size_t kValid = static_cast<size_t>(-1);

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates, code points above U+10FFFF, stray continuation bytes and truncated sequences are all
// rejected), or kValid.
size_t FindInvalid(std::string_view s);

// Appends `bytes` to `out`, replacing every maximal invalid subpart with U+FFFD.
void AppendLossy(std::string_view bytes, std::string* out);

// Streaming form of AppendLossy: decodes the longest prefix of `bytes` whose decoding can no longer
// change when more bytes arrive, appends it to `out`, and returns its length. What is left is a
// valid-so-far but incomplete sequence (at most 3 bytes) that the caller keeps for later.
size_t AppendLossyComplete(std::string_view bytes, std::string* out);

// Appends the UTF-8 encoding of code point `cp` (which must be a Unicode scalar value).
void AppendCodePoint(char32_t cp, std::string* out);

// Decodes the code point starting at s[*pos] in well-formed UTF-8 and advances *pos past it.
char32_t DecodeValid(std::string_view s, size_t* pos);

}  // namespace dsmesh::utf8
