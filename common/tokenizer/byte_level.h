// The GPT-2 "ByteLevel" alphabet: every byte 0..255 is shown as one printable code point (printable
// Latin-1 bytes stand for themselves, the rest are shifted to U+0100..U+0143, so a space is "Ġ").
// Vocabulary and merges in tokenizer.json are written in this alphabet; the tokenizer converts them
// to raw bytes once at load time and then works on bytes only.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace dsmesh::byte_level {

// Code point that stands for byte b.
char32_t ByteToCodePoint(unsigned char b);

// Byte that code point cp stands for, or nullopt if cp is not in the alphabet.
std::optional<unsigned char> CodePointToByte(char32_t cp);

// Converts a vocabulary string (UTF-8 text in the ByteLevel alphabet) to the raw bytes it stands
// for; nullopt if it contains a code point outside the alphabet.
std::optional<std::string> ToBytes(std::string_view token);

// The ByteLevel spelling of raw bytes (inverse of ToBytes).
std::string FromBytes(std::string_view bytes);

}  // namespace dsmesh::byte_level
