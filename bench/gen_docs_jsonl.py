# Packed-document benchmark corpus: made-up prose as JSON lines, one document a line, of about
# MEAN_WORDS words each (geometric lengths), from a fixed word list and seed. With the fixture
# tokenizer (tests/fixtures/tokenizer) a word is about 1.3 tokens.
# Usage: python3 bench/gen_docs_jsonl.py OUT.jsonl [N_DOCS] [MEAN_WORDS]
import json, random, sys
out = sys.argv[1]
n_docs = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
mean = float(sys.argv[3]) if len(sys.argv) > 3 else 390
words = ("the king and queen of a noble house speak now my lord shall we go unto thee thou art "
         "sweet night day crown sword love hate death life o what is this that here there come").split()
rng = random.Random(1234)
with open(out, "w") as f:
    for _ in range(n_docs):
        n = max(1, int(rng.expovariate(1.0 / mean)))
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n)) + "."}) + "\n")
