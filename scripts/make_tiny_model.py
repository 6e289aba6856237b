#!/usr/bin/env python3
"""Build models/tiny: a small byte-level BPE model directory that kvmesh ships for tests.

The repository never downloads a model, so tests, the mock engine and `kvmesh up` need a real
Hugging Face style model directory that lives in git. This script makes one deterministically:

1. writes scripts/tiny_corpus.txt, an English (plus a little French, German, Spanish, Chinese and
   Japanese) text generated from sentences and word lists authored for kvmesh, redistributable
   under the repository's license;
2. trains a byte-level BPE tokenizer (Qwen2-style pre-tokenizer) on it with the `tokenizers`
   package from PyPI, then adds the ChatML special tokens after the ordinary vocabulary;
3. writes tokenizer.json, tokenizer_config.json (ChatML chat template with system prompts and
   tools), config.json and generation_config.json into models/tiny/.

Usage (from the repository root):

    python3 -m venv .venv && .venv/bin/pip install tokenizers
    .venv/bin/python scripts/make_tiny_model.py          # regenerate
    .venv/bin/python scripts/make_tiny_model.py --check  # verify the committed files match
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CORPUS_PATH = ROOT / "scripts" / "tiny_corpus.txt"
MODEL_DIR = ROOT / "models" / "tiny"

# Ordinary vocabulary size; the three special tokens follow it.
NUM_ORDINARY_TOKENS = 3000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONTEXT_LENGTH = 8192
NUM_GENERATED_SENTENCES = 5000

# The split pattern of Qwen2 tokenizers: contractions, letters, single digits, punctuation runs,
# newlines and whitespace. It needs a regex engine with look-ahead (onig on the Rust side).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and"
    " arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# ---------------------------------------------------------------------------------------------
# Corpus. Everything below was written for kvmesh; the generator only recombines it.
# ---------------------------------------------------------------------------------------------

PARAGRAPHS = [
    "kvmesh serves language model requests from many clients to many inference workers. "
    "Each request goes to the worker that already caches the longest prefix of its prompt, "
    "unless that worker is too loaded to be worth it.",
    "The frontend accepts OpenAI style chat completions, renders the chat template, tokenizes "
    "the prompt and streams tokens back to the client as server sent events.",
    "A router keeps track of every request it sends to a worker until the request ends. It "
    "asks the indexers how many prompt blocks each worker caches and combines that with the "
    "load of each worker before it picks one.",
    "The indexer holds a radix tree of block hashes. For a sequence of blocks it answers how "
    "long a prefix each worker caches. Workers publish events when they store or remove blocks.",
    "The mock worker behaves like an inference engine without a graphics card: it has paged "
    "blocks with prefix caching and eviction, a scheduler with a batch budget and a timing model "
    "for prefill and decode.",
    "When a client disconnects, the request is cancelled end to end so that no worker keeps "
    "generating tokens that nobody will read.",
    "Stop strings are checked on the decoded text. Text that could be the start of a stop string "
    "is held back until the next piece decides whether the stop string matched.",
    "Incremental detokenization decodes a small window of tokens and only emits text once it no "
    "longer ends with a broken character, so a multi byte character is never split.",
    "Every process registers itself in discovery with a lease. When a process dies, its lease "
    "expires and its records disappear by themselves.",
    "A chat template turns a list of messages into the exact prompt text the model was trained "
    "on. System prompts, tool definitions and the generation prompt all come from the template.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.",
    "It was a bright cold morning in the valley. The river ran fast after the rain, and the "
    "bridge by the old mill shook a little whenever a cart went over it.",
    "Good software is written twice: once to learn what the problem is, and once to solve it. "
    "The second version is shorter, clearer and usually faster.",
    "Please answer briefly. If you do not know the answer, say so instead of guessing.",
    "Thank you for your question! Here is a short summary of the main points, followed by an "
    "example that you can run yourself.",
]

CODE_SNIPPETS = [
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))\n",
    "fn main() {\n    let numbers = vec![1, 2, 3];\n    let total: i32 = numbers.iter().sum();\n"
    "    println!(\"total = {total}\");\n}\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'is even')\n    else:\n"
    "        print(i, 'is odd')\n",
    "import json\n\nwith open('config.json') as f:\n    config = json.load(f)\n"
    "print(config['max_position_embeddings'])\n",
    "pub struct Worker {\n    pub id: u64,\n    pub active_blocks: usize,\n}\n\n"
    "impl Worker {\n    pub fn is_idle(&self) -> bool {\n        self.active_blocks == 0\n    }\n}\n",
    "curl http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' "
    "-d '{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n",
    "SELECT name, count(*) FROM requests WHERE status = 'ok' GROUP BY name ORDER BY 2 DESC;\n",
    "const total = items.reduce((sum, item) => sum + item.price, 0);\nconsole.log(total);\n",
]

FOREIGN_LINES = [
    "Bonjour, comment allez-vous ? Je vais bien, merci. Le train part à huit heures.",
    "Guten Morgen! Das Wetter ist heute schön, und wir gehen später in den Park.",
    "Hola, ¿cómo estás? Muy bien, gracias. La biblioteca abre a las nueve.",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "谢谢你的帮助。这个问题很简单。",
    "こんにちは、世界。今日はいい天気ですね。",
    "ありがとうございます。また明日。",
    "Café, naïve, façade, déjà vu, über, smörgåsbord, jalapeño.",
]

NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
         "Mallory", "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter"]
NOUNS = ["request", "worker", "token", "prompt", "model", "router", "cache", "block", "message",
         "server", "client", "stream", "answer", "question", "river", "garden", "window", "book",
         "city", "train", "letter", "kitchen", "mountain", "computer", "program", "function",
         "teacher", "student", "doctor", "market", "bridge", "forest", "island", "machine",
         "engine", "schedule", "report", "table", "picture", "song", "story", "idea", "plan"]
ADJECTIVES = ["small", "large", "quick", "slow", "bright", "quiet", "busy", "empty", "new",
              "old", "simple", "careful", "warm", "cold", "green", "blue", "red", "happy",
              "tired", "clever", "strange", "useful", "short", "long", "early", "late"]
VERBS_PAST = ["sent", "found", "opened", "closed", "read", "wrote", "built", "fixed", "moved",
              "saw", "heard", "checked", "cached", "routed", "streamed", "counted", "painted",
              "cleaned", "visited", "answered", "started", "stopped", "finished", "measured"]
VERBS_PRESENT = ["sends", "finds", "opens", "reads", "writes", "builds", "fixes", "moves",
                 "checks", "caches", "routes", "streams", "counts", "answers", "starts",
                 "stops", "needs", "keeps", "returns", "explains", "prefers", "watches"]
ADVERBS = ["quickly", "slowly", "carefully", "quietly", "again", "today", "yesterday",
           "tomorrow", "often", "rarely", "always", "never", "soon", "already", "finally"]
PLACES = ["in the morning", "after lunch", "at night", "near the station", "by the river",
          "in the garden", "on the second floor", "at the market", "before the meeting",
          "during the test", "under the bridge", "across the street"]
QUESTIONS = [
    "What is the capital of {place}?",
    "How many {noun}s does {name} have?",
    "Can you explain how a {noun} works?",
    "Why did {name} open the {adj} {noun}?",
    "Write a short poem about a {adj} {noun}.",
    "Summarize the story of the {adj} {noun} in one sentence.",
    "What should I do if the {noun} is too {adj}?",
    "Translate 'the {adj} {noun}' into French.",
]
COUNTRIES = ["France", "Germany", "Spain", "Japan", "China", "Italy", "Canada", "Brazil",
             "Kenya", "Norway", "India", "Mexico", "Egypt", "Chile", "Poland"]
TOOLS = ["get_weather", "search_documents", "get_time", "send_email", "create_event",
         "lookup_order", "convert_currency"]
CITIES = ["Paris", "Berlin", "Madrid", "Tokyo", "Beijing", "Rome", "Toronto", "Lima", "Oslo",
          "Nairobi", "Cairo", "Warsaw", "Delhi", "Santiago"]
SYLLABLES = ["ka", "lo", "mir", "ben", "tra", "vik", "sol", "den", "qua", "rin", "zel", "mar",
             "ost", "pel", "gur", "fen", "dra", "shi", "nor", "val", "tesk", "brim", "holt",
             "wyn", "cor", "ix", "um", "ela", "and", "rho", "plen", "stav", "kir", "moth"]
MORE_WORDS = [
    "algorithm", "analysis", "apartment", "argument", "assistant", "attention", "audience",
    "balance", "battery", "bicycle", "boundary", "breakfast", "calendar", "candidate",
    "category", "ceremony", "challenge", "chemistry", "classroom", "collection", "committee",
    "community", "comparison", "competition", "condition", "conference", "connection",
    "container", "conversation", "database", "decision", "definition", "delivery",
    "department", "description", "difference", "direction", "discussion", "distribution",
    "education", "efficiency", "electricity", "employee", "environment", "equipment",
    "evidence", "experience", "experiment", "explanation", "expression", "festival",
    "foundation", "freedom", "friendship", "furniture", "generation", "government",
    "guidance", "highway", "history", "hospital", "household", "improvement", "independence",
    "industry", "information", "instruction", "instrument", "insurance", "interaction",
    "introduction", "investment", "knowledge", "landscape", "language", "leadership",
    "library", "literature", "location", "maintenance", "management", "measurement",
    "membership", "memory", "method", "midnight", "neighbor", "network", "newspaper",
    "operation", "opinion", "orchestra", "organization", "painting", "partition", "passenger",
    "performance", "permission", "personality", "perspective", "philosophy", "photograph",
    "population", "possibility", "potato", "preference", "preparation", "presentation",
    "priority", "procedure", "production", "profession", "property", "proposal", "protection",
    "quality", "quantity", "reaction", "recipe", "recommendation", "reflection", "refrigerator",
    "relationship", "replica", "requirement", "resolution", "resource", "response",
    "restaurant", "revolution", "satisfaction", "scheduler", "science", "secretary",
    "selection", "sequence", "shortcut", "signature", "situation", "snapshot", "software",
    "solution", "specialist", "statement", "strategy", "structure", "subscription",
    "suggestion", "supermarket", "surprise", "technology", "telephone", "temperature",
    "tendency", "territory", "threshold", "tokenizer", "tradition", "transaction",
    "transformation", "transport", "umbrella", "university", "variable", "variety",
    "vegetable", "vocabulary", "volunteer", "weakness", "wedding", "welcome", "wilderness",
    "workshop", "yesterday", "abstract", "accurate", "ambitious", "ancient", "anxious",
    "automatic", "beautiful", "brilliant", "comfortable", "complicated", "confident",
    "consistent", "curious", "delicious", "dependable", "efficient", "elegant", "enormous",
    "expensive", "familiar", "fortunate", "generous", "gentle", "gradual", "historical",
    "horizontal", "immediate", "important", "incremental", "intelligent", "interesting",
    "magnificent", "mysterious", "necessary", "obvious", "ordinary", "particular", "peaceful",
    "permanent", "political", "powerful", "practical", "previous", "professional",
    "reasonable", "reliable", "remarkable", "responsible", "scientific", "sensitive",
    "significant", "successful", "sufficient", "suspicious", "temporary", "terrible",
    "traditional", "unusual", "valuable", "vertical", "wonderful", "accept", "achieve",
    "acquire", "adjust", "admire", "allocate", "announce", "appreciate", "approve", "arrange",
    "assemble", "attach", "balance", "benchmark", "borrow", "calculate", "celebrate",
    "collapse", "combine", "compile", "complain", "compress", "configure", "consider",
    "construct", "continue", "convince", "cooperate", "decrease", "deliver", "deploy",
    "describe", "develop", "discover", "distribute", "encourage", "evaluate", "examine",
    "expand", "generate", "guarantee", "identify", "imagine", "increase", "influence",
    "inspect", "introduce", "investigate", "maintain", "measure", "negotiate", "observe",
    "organize", "persuade", "predict", "prepare", "prevent", "produce", "publish", "recommend",
    "recover", "register", "release", "remember", "replace", "schedule", "serialize",
    "simplify", "subscribe", "succeed", "suggest", "summarize", "translate", "validate",
]
EMOJI = ["🙂", "🚀", "🎉", "👍", "🌍", "🔥", "✨", "📦"]


class Lcg:
    """A 64-bit linear congruential generator: the same sequence on every Python version."""

    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.state >> 33

    def below(self, n):
        return self.next() % n

    def pick(self, items):
        return items[self.below(len(items))]


def invented_name(rng):
    return "".join(rng.pick(SYLLABLES) for _ in range(2 + rng.below(2))).capitalize()


def sentence(rng):
    kind = rng.below(12)
    if kind == 10:
        words = [rng.pick(MORE_WORDS) for _ in range(4 + rng.below(5))]
        return f"{rng.pick(NAMES)} wrote: " + ", ".join(words) + "."
    if kind == 11:
        return (f"The town of {invented_name(rng)} lies {rng.pick(['north', 'south', 'east', 'west'])}"
                f" of {invented_name(rng)}, where the {rng.pick(MORE_WORDS)} is"
                f" {rng.pick(MORE_WORDS)}.")
    name, other = rng.pick(NAMES), rng.pick(NAMES)
    noun, noun2 = rng.pick(NOUNS), rng.pick(NOUNS)
    adj = rng.pick(ADJECTIVES)
    if kind == 0:
        return f"{name} {rng.pick(VERBS_PAST)} the {adj} {noun} {rng.pick(PLACES)}."
    if kind == 1:
        return (f"The {noun} {rng.pick(VERBS_PRESENT)} the {noun2} {rng.pick(ADVERBS)}, "
                f"and {other} {rng.pick(VERBS_PRESENT)} the rest.")
    if kind == 2:
        q = rng.pick(QUESTIONS).format(place=rng.pick(COUNTRIES), noun=noun, name=name, adj=adj)
        return q
    if kind == 3:
        n = rng.below(1000)
        m = rng.below(100)
        return f"There were {n} {noun}s and {m} {noun2}s, so the total was {n + m}."
    if kind == 4:
        day, month, year = 1 + rng.below(28), 1 + rng.below(12), 1990 + rng.below(40)
        return (f"On {year}-{month:02d}-{day:02d}, {name} {rng.pick(VERBS_PAST)} a "
                f"{adj} {noun} for {other}.")
    if kind == 5:
        return (f"\"Is the {noun} {adj}?\" asked {name}. \"Not {rng.pick(ADVERBS)},\" "
                f"said {other}.")
    if kind == 6:
        city = rng.pick(CITIES)
        temp = rng.below(40) - 5
        return f"The weather in {city} is {adj} today, with a temperature of {temp} degrees."
    if kind == 7:
        pct = rng.below(100)
        return (f"The {noun} cache hit rate was {pct}% and the {noun2} latency was "
                f"{rng.below(500)} ms.")
    if kind == 8:
        return f"{name} {rng.pick(VERBS_PRESENT)} that every {noun} is {adj} {rng.pick(EMOJI)}"
    return f"I think the {adj} {noun} {rng.pick(VERBS_PRESENT)} the {noun2} {rng.pick(PLACES)}."


def tool_call_line(rng):
    tool = rng.pick(TOOLS)
    args = {"location": rng.pick(CITIES), "unit": rng.pick(["celsius", "fahrenheit"])}
    if tool != "get_weather":
        args = {"query": f"{rng.pick(ADJECTIVES)} {rng.pick(NOUNS)}", "limit": 1 + rng.below(10)}
    call = json.dumps({"name": tool, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def chat_line(rng):
    return (f"<|im_start|>user\n{sentence(rng)}<|im_end|>\n"
            f"<|im_start|>assistant\n{sentence(rng)} {sentence(rng)}<|im_end|>")


def make_corpus():
    rng = Lcg(0x6B766D657368)  # "kvmesh"
    lines = []
    for i in range(NUM_GENERATED_SENTENCES):
        if i % 40 == 0:
            lines.append(PARAGRAPHS[(i // 40) % len(PARAGRAPHS)])
        if i % 97 == 0:
            lines.append(CODE_SNIPPETS[(i // 97) % len(CODE_SNIPPETS)])
        if i % 53 == 0:
            lines.append(FOREIGN_LINES[(i // 53) % len(FOREIGN_LINES)])
        if i % 61 == 0:
            lines.append(tool_call_line(rng))
        if i % 71 == 0:
            lines.append(chat_line(rng))
        lines.append(sentence(rng))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Model directory.
# ---------------------------------------------------------------------------------------------


def train_tokenizer(corpus_path):
    tokenizer = Tokenizer(models.BPE(byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                    use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=NUM_ORDINARY_TOKENS,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train([str(corpus_path)], trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


def compact_tokenizer_json(tokenizer):
    """tokenizer.json with one vocabulary entry or merge per line: small on disk, diffable."""
    data = json.loads(tokenizer.to_str())
    model = data.pop("model")
    vocab = model.pop("vocab")
    merges = model.pop("merges")

    def dumps(value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    head = [f"{dumps(key)}:{dumps(value)}" for key, value in data.items()]
    model_head = [f"{dumps(key)}:{dumps(value)}" for key, value in model.items()]
    vocab_lines = ",\n".join(f"{dumps(token)}:{token_id}" for token, token_id in vocab.items())
    merge_lines = ",\n".join(dumps(merge) for merge in merges)
    model_text = ("{" + ",".join(model_head) + ',\n"vocab":{\n' + vocab_lines
                  + '\n},\n"merges":[\n' + merge_lines + "\n]}")
    text = "{" + ",\n".join(head + ['"model":' + model_text]) + "}\n"
    if json.loads(text) != json.loads(tokenizer.to_str()):
        raise RuntimeError("tokenizer.json layout changed its content")
    return text


def write_model(out_dir, corpus_path):
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_path)
    (out_dir / "tokenizer.json").write_text(compact_tokenizer_json(tokenizer), encoding="utf-8")
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    added_tokens_decoder = {
        str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": CONTEXT_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": CONTEXT_LENGTH,
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
    }
    generation_config = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
    }
    for name, value in [("tokenizer_config.json", tokenizer_config), ("config.json", config),
                        ("generation_config.json", generation_config)]:
        text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
        (out_dir / name).write_text(text, encoding="utf-8")


OUTPUT_FILES = ["tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare with the repo")
    args = parser.parse_args()
    corpus = make_corpus()
    if not args.check:
        CORPUS_PATH.write_text(corpus, encoding="utf-8")
        write_model(MODEL_DIR, CORPUS_PATH)
        for name in OUTPUT_FILES:
            print(f"{MODEL_DIR / name}: {(MODEL_DIR / name).stat().st_size} bytes")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "corpus.txt").write_text(corpus, encoding="utf-8")
        write_model(tmp / "model", tmp / "corpus.txt")
        stale = []
        if CORPUS_PATH.read_text(encoding="utf-8") != corpus:
            stale.append(str(CORPUS_PATH))
        for name in OUTPUT_FILES:
            if (tmp / "model" / name).read_bytes() != (MODEL_DIR / name).read_bytes():
                stale.append(str(MODEL_DIR / name))
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    print("models/tiny is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
