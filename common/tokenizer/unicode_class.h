// Character-class tests the tokenizer needs outside its regexes, answered by PCRE2's Unicode tables
// (so they agree with the pre-tokenizer) or, for whitespace, by the ECMAScript definition that the
// reference implementation (@lenml/tokenizers, JavaScript) uses for \s and String.prototype.trim.
#pragma once

#include <string_view>

namespace dsmesh::unicode_class {

// ECMAScript WhiteSpace or LineTerminator: TAB, LF, VT, FF, CR, SPACE, NBSP, U+1680, U+2000..U+200A,
// U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF.
bool IsJsWhitespace(char32_t cp);

// The same set written as the body of a PCRE2 character class (without the brackets).
extern const char kJsWhitespaceClassBody[];

// Unicode word character as HF tokenizers' single_word test sees it (Rust regex \w: letters, marks,
// decimal and letter numbers, connector punctuation, ZWNJ/ZWJ).
bool IsWordChar(char32_t cp);

}  // namespace dsmesh::unicode_class
