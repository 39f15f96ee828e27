#!/usr/bin/env python3
"""followups.py - how the prompt form of follow-up questions changes the answers (docs/eval.md).

Generates seeded memos (about 1.2K tokens of office text around six planted facts: a contact and
her extension, a supplier, a unit count, a review date, a room), then asks four different
questions about each memo in one kvchat conversation (`kvchat ask --session`, so every question
goes through the session code the terminal interface uses: sess_resume, sess_ask) with greedy
decoding, and counts right answers and copies (an answer identical to an earlier answer about the
same memo). Deterministic for a seed: the memos come from Python's seeded Random, the
answers from greedy decoding.

usage: bench/followups.py [--memos 10] [--seed 1] [--form NAME=ARGS ...] [--kvchat ./kvchat]
       a form is a name and the extra `kvchat ask` arguments of every question, e.g.
       history='--plain --followups history' independent='--plain --followups independent'
Writes one CSV row per question to stdout (or --csv FILE) and the table to stderr."""
import argparse, csv, os, random, shlex, subprocess, sys, tempfile

FIRST = ["Gwendolyn", "Tobias", "Marisol", "Anselm", "Priya", "Henrik", "Odalys", "Casimir", "Leontyne", "Bartholomew",
         "Ingrid", "Ezekiel", "Rosalind", "Thaddeus", "Yolanda", "Lucius"]
LAST = ["Oyelaran", "Vandersloot", "Quintero", "Halvorsen", "Mbeki", "Castellano", "Okonkwo", "Ferreira", "Lindqvist",
        "Abernathy", "Nakashima", "Delacroix", "Brannigan", "Szymanski", "Achterberg", "Kowalczyk"]
SUPPLIERS = ["Harrowgate Fasteners", "Blue Heron Plastics", "Korvath Metalworks", "Pemberton Cables",
             "Silverline Optics", "Tamarack Tooling", "Ostrava Bearings", "Wexford Adhesives", "Cobalt Ridge Valves",
             "Marlowe Packaging"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SUBJ = ["The finance team", "The night shift", "Our auditors", "The warehouse crew", "The design group",
        "The safety committee", "The regional office", "The quality lab", "Facilities", "The training staff"]
VERB = ["reviewed", "updated", "postponed", "discussed", "approved", "questioned", "circulated", "archived",
        "summarized", "revised"]
OBJ = ["the quarterly forecast", "the parking rules", "the holiday calendar", "the printer contract",
       "the onboarding checklist", "the cafeteria menu", "the badge policy", "the travel guidelines",
       "the recycling plan", "the shift rota"]
TAIL = ["after a long discussion", "without any objections", "before the end of the week", "at the request of management",
        "following the last inspection", "as agreed in the spring", "for the second time this year",
        "with minor corrections"]


def filler(rng, n):
    return " ".join(f"{rng.choice(SUBJ)} {rng.choice(VERB)} {rng.choice(OBJ)} {rng.choice(TAIL)}." for _ in range(n))


def memo(seed, k):
    """Memo k of a seed: its text and its questions as (question, expected text) pairs, four of six."""
    rng = random.Random(seed * 1000003 + k)
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    ext, units, room = rng.randint(1000, 9999), rng.randint(120, 980), rng.randint(100, 699)
    supplier = rng.choice(SUPPLIERS)
    day, month = rng.randint(2, 28), rng.choice(MONTHS)
    first = name.split()[0]
    # the facts come in pairs, two to a sentence, the way a memo writes them: a question about one
    # finds the other beside it (what a base model copies from an earlier answer)
    sentences = [f"For anything about the new assembly line, contact {name}, extension {ext}.",
                 f"{supplier} will deliver {units} units of the new sensor.",
                 f"The design review is on {month} {day} in room {room}."]
    qs = [("Who is the contact person for the new assembly line?", name.split()[1]),
          (f"What is {first}'s extension?", str(ext)),
          ("Which company delivers the new sensor?", supplier.split()[0]),
          ("How many units of the new sensor will be delivered?", str(units)),
          ("On what date is the design review?", f"{month} {day}"),
          ("In which room is the design review?", str(room))]
    rng.shuffle(sentences)
    parts = [f"MEMO {k + 1}: plant operations update.", filler(rng, 10)]
    for f in sentences:   # spread through the memo, in a seeded order
        parts += [f, filler(rng, 18)]
    return "\n\n".join(parts) + "\n", [qs[i] for i in rng.sample(range(len(qs)), 4)]


def right(answer, expect):
    return expect.lower() in " ".join(answer.lower().split())


def norm(answer):
    return " ".join(answer.split()).strip(" .").lower()


def ask(kvchat, db, session, doc, question, extra, n_predict):
    cmd = [kvchat, "ask", "-d", doc, "-q", question, "--session", session, "--db", db, "-n", str(n_predict)] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"followups.py: {' '.join(map(shlex.quote, cmd))}: {p.stderr.strip()}")
    return p.stdout.strip()   # the metrics go to stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memos", type=int, default=10)
    ap.add_argument("--first", type=int, default=0, help="the first memo's number")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kvchat", default="./kvchat")
    ap.add_argument("--form", action="append", default=[])
    ap.add_argument("--csv")
    ap.add_argument("--n-predict", type=int, default=512, help="answer tokens at most (the TUI's default)")
    ap.add_argument("--fresh", action="store_true", help="every question in its own conversation (no follow-ups)")
    ap.add_argument("--print-memo", type=int, metavar="K", help="print memo K and its questions, ask nothing")
    a = ap.parse_args()
    if a.print_memo is not None:
        text, qs = memo(a.seed, a.print_memo)
        print(text, end="")
        for q, e in qs:
            print(f"{q}\t{e}", file=sys.stderr)
        return
    forms = [f.split("=", 1) for f in a.form] or [["default", ""]]
    out = open(a.csv, "w", newline="") if a.csv else sys.stdout
    w = csv.writer(out)
    w.writerow(["form", "memo", "turn", "question", "expected", "answer", "correct", "copy"])
    with tempfile.TemporaryDirectory(prefix="kvchat-followups-") as tmp:
        summary = []
        for name, args in forms:
            extra = shlex.split(args)
            n_right = n_copy = n = 0
            for k in range(a.first, a.first + a.memos):
                text, qs = memo(a.seed, k)
                doc = os.path.join(tmp, f"memo{k}.txt")
                with open(doc, "w") as f:
                    f.write(text)
                db = os.path.join(tmp, f"{name}-{k}.db")
                seen = []
                for t, (q, e) in enumerate(qs):
                    sess = f"m{k}-{t}" if a.fresh else f"m{k}"
                    ans = ask(a.kvchat, db, sess, doc, q, extra, a.n_predict)
                    ok, cp = right(ans, e), norm(ans) in seen
                    seen.append(norm(ans))
                    n_right, n_copy, n = n_right + ok, n_copy + cp, n + 1
                    w.writerow([name, k, t, q, e, ans, int(ok), int(cp)])
                    out.flush()
            summary.append((name, args, n_right, n_copy, n))
        for name, args, r, c, n in summary:
            print(f"{name:14s} right {r:3d}/{n}  copies {c:3d}  ({args})", file=sys.stderr)


if __name__ == "__main__":
    main()
