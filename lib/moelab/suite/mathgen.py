"""Templated GSM8K-style word problems with worked answers ending ``#### <number>``.

GSM8K itself is not obtainable offline (see docs/offline-assets.md), so the instruction mix and the
maths evaluation use problems generated from 25 hand-written templates: each draws names, objects and numbers
from a seeded generator, and its worked solution computes every step in Python (the answer is exact by
construction). The split is *by template*: ``HELD_OUT`` templates never appear in training data, so the
maths evaluation measures transfer to unseen problem structures, not memorised templates.
Used by the MoCE notebook 01 (maths domain) and the scorecard.
"""
from __future__ import annotations

import zlib

import numpy as np

NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam", "Maya",
         "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells", "cards", "beads"]


def _fmt(x) -> str:
    x = float(x)
    return str(int(round(x))) if abs(x - round(x)) < 1e-9 else f"{x:.2f}".rstrip("0").rstrip(".")


# Each template: rng -> (question, [solution lines], answer). Answers are integers by construction.
def t_shopping(r):
    n, a, price, b = r.choice(NAMES), int(r.integers(3, 12)), int(r.integers(2, 9)), int(r.integers(2, 6))
    total = a * price + b * 3
    return (f"{n} buys {a} notebooks at ${price} each and {b} pens at $3 each. How many dollars does {n} spend?",
            [f"The notebooks cost {a} * {price} = {a * price} dollars.", f"The pens cost {b} * 3 = {b * 3} dollars.",
             f"In total {n} spends {a * price} + {b * 3} = {total} dollars."], total)


def t_share(r):
    n, item, k = r.choice(NAMES), r.choice(ITEMS), int(r.integers(2, 7))
    each, extra = int(r.integers(3, 15)), int(r.integers(1, 10))
    total = k * each + extra
    return (f"{n} has {total} {item}. {n} keeps {extra} and shares the rest equally among {k} friends. "
            f"How many {item} does each friend get?",
            [f"{n} shares {total} - {extra} = {total - extra} {item}.", f"Each friend gets {total - extra} / {k} = {each}."], each)


def t_age(r):
    a, b = r.choice(NAMES, 2, replace=False)
    age, diff, yrs = int(r.integers(5, 30)), int(r.integers(2, 15)), int(r.integers(2, 10))
    ans = age + diff + yrs
    return (f"{a} is {age} years old. {b} is {diff} years older than {a}. How old will {b} be in {yrs} years?",
            [f"{b} is {age} + {diff} = {age + diff} years old.", f"In {yrs} years {b} will be {age + diff} + {yrs} = {ans}."], ans)


def t_speed(r):
    n, v, h, m = r.choice(NAMES), int(r.integers(30, 90)), int(r.integers(2, 6)), int(r.integers(1, 4))
    ans = v * h + (v // 2) * m
    return (f"{n} drives at {v} km per hour for {h} hours, then at {v // 2} km per hour for {m} more hours. "
            f"How many kilometres does {n} drive?",
            [f"First part: {v} * {h} = {v * h} km.", f"Second part: {v // 2} * {m} = {(v // 2) * m} km.",
             f"Total: {v * h} + {(v // 2) * m} = {ans} km."], ans)


def t_percent_discount(r):
    price, pct = int(r.integers(2, 20)) * 10, int(r.choice([10, 20, 25, 30, 50]))
    off = price * pct // 100
    return (f"A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price in dollars?",
            [f"The discount is {pct}% of {price} = {off} dollars.", f"The sale price is {price} - {off} = {price - off} dollars."],
            price - off)


def t_rectangle(r):
    w, l, c = int(r.integers(3, 20)), int(r.integers(3, 20)), int(r.integers(2, 9))
    ans = w * l * c
    return (f"A garden is {w} metres wide and {l} metres long. Fertiliser costs ${c} per square metre. "
            f"How many dollars does it cost to fertilise the whole garden?",
            [f"The area is {w} * {l} = {w * l} square metres.", f"The cost is {w * l} * {c} = {ans} dollars."], ans)


def t_weekly_savings(r):
    n, s, w = r.choice(NAMES), int(r.integers(5, 30)), int(r.integers(3, 12))
    spend = int(r.integers(5, s * w))
    ans = s * w - spend
    return (f"{n} saves ${s} every week for {w} weeks and then spends ${spend} on a game. How many dollars are left?",
            [f"{n} saves {s} * {w} = {s * w} dollars.", f"After the game {s * w} - {spend} = {ans} dollars are left."], ans)


def t_pages(r):
    n, p, d, rest = r.choice(NAMES), int(r.integers(10, 40)), int(r.integers(3, 9)), int(r.integers(10, 90))
    total = p * d + rest
    return (f"{n}'s book has {total} pages. {n} reads {p} pages a day for {d} days. How many pages are left?",
            [f"{n} reads {p} * {d} = {p * d} pages.", f"Pages left: {total} - {p * d} = {rest}."], rest)


def t_boxes(r):
    item, b, per, broken = r.choice(ITEMS), int(r.integers(3, 12)), int(r.integers(6, 25)), int(r.integers(1, 10))
    ans = b * per - broken
    return (f"A shop receives {b} boxes with {per} {item} in each box. {broken} {item} are damaged and thrown away. "
            f"How many {item} can the shop sell?",
            [f"The shop receives {b} * {per} = {b * per} {item}.", f"It can sell {b * per} - {broken} = {ans}."], ans)


def t_wages(r):
    n, rate, h, ot = r.choice(NAMES), int(r.integers(10, 25)), int(r.integers(20, 40)), int(r.integers(1, 8))
    ans = rate * h + rate * 2 * ot
    return (f"{n} earns ${rate} per hour and double that for overtime. One week {n} works {h} regular hours "
            f"and {ot} overtime hours. How many dollars does {n} earn?",
            [f"Regular pay: {rate} * {h} = {rate * h} dollars.", f"Overtime rate: 2 * {rate} = {2 * rate} dollars.",
             f"Overtime pay: {2 * rate} * {ot} = {2 * rate * ot} dollars.", f"Total: {rate * h} + {2 * rate * ot} = {ans}."], ans)


def t_fraction(r):
    n, item = r.choice(NAMES), r.choice(ITEMS)
    den = int(r.choice([2, 3, 4, 5])); k = int(r.integers(4, 20)); total = den * k; num = int(r.integers(1, den))
    ans = total - num * k
    return (f"{n} had {total} {item} and gave away {num}/{den} of them. How many {item} does {n} have now?",
            [f"{num}/{den} of {total} is {num * k}.", f"{n} has {total} - {num * k} = {ans} left."], ans)


def t_tickets(r):
    a, c, pa, pc = int(r.integers(1, 6)), int(r.integers(1, 8)), int(r.integers(8, 20)), int(r.integers(3, 8))
    ans = a * pa + c * pc
    return (f"Adult tickets cost ${pa} and child tickets cost ${pc}. A family buys {a} adult and {c} child tickets. "
            f"What is the total cost in dollars?",
            [f"Adults: {a} * {pa} = {a * pa}.", f"Children: {c} * {pc} = {c * pc}.", f"Total: {a * pa} + {c * pc} = {ans}."], ans)


def t_average(r):
    vals = [int(v) for v in r.integers(50, 100, size=int(r.integers(3, 6)))]
    s = sum(vals); k = len(vals); vals[-1] += (k - s % k) % k; s = sum(vals)
    return (f"A student scored {', '.join(map(str, vals[:-1]))} and {vals[-1]} on {k} tests. What is the average score?",
            [f"The scores sum to {' + '.join(map(str, vals))} = {s}.", f"The average is {s} / {k} = {s // k}."], s // k)


def t_train_time(r):
    start, dur = int(r.integers(6, 12)), int(r.integers(2, 6)); stop = int(r.integers(1, 3))
    ans = start + dur + stop
    return (f"A train leaves at {start} o'clock in the morning and travels for {dur} hours, then waits {stop} hours "
            f"at a station. At what hour (24-hour clock) is it ready to continue?",
            [f"After travelling it is {start} + {dur} = {start + dur} o'clock.", f"After waiting it is {start + dur} + {stop} = {ans}."], ans)


def t_legs(r):
    c, d = int(r.integers(2, 15)), int(r.integers(2, 15))
    ans = 2 * c + 4 * d
    return (f"A farm has {c} chickens and {d} cows. How many legs do the animals have in total?",
            [f"Chickens have {c} * 2 = {2 * c} legs.", f"Cows have {d} * 4 = {4 * d} legs.", f"Total: {2 * c} + {4 * d} = {ans}."], ans)


def t_recipe(r):
    base, cups, people = int(r.integers(2, 6)), int(r.integers(1, 5)), 0
    mult = int(r.integers(2, 6)); people = base * mult
    ans = cups * mult
    return (f"A recipe for {base} people needs {cups} cups of flour. How many cups are needed for {people} people?",
            [f"{people} people is {people} / {base} = {mult} times the recipe.", f"Flour: {cups} * {mult} = {ans} cups."], ans)


def t_consecutive(r):
    x, k = int(r.integers(1, 50)), int(r.choice([3, 5]))
    s = sum(range(x, x + k))
    return (f"The sum of {k} consecutive whole numbers is {s}. What is the largest of them?",
            [f"The middle number is {s} / {k} = {x + k // 2}.", f"The largest is {x + k // 2} + {k // 2} = {x + k - 1}."], x + k - 1)


def t_tank(r):
    cap, rate, t = int(r.integers(10, 40)) * 10, int(r.integers(5, 20)), 0
    t = int(r.integers(2, 10)); filled = rate * t
    while filled >= cap:
        cap += 100
    ans = cap - filled
    return (f"A tank holds {cap} litres. Water flows in at {rate} litres per minute for {t} minutes. "
            f"How many more litres are needed to fill it?",
            [f"Water added: {rate} * {t} = {filled} litres.", f"Still needed: {cap} - {filled} = {ans} litres."], ans)


def t_coins(r):
    q, d, n = int(r.integers(1, 12)), int(r.integers(1, 12)), int(r.integers(1, 12))
    ans = 25 * q + 10 * d + 5 * n
    return (f"A jar has {q} quarters, {d} dimes and {n} nickels. How many cents are in the jar?",
            [f"Quarters: {q} * 25 = {25 * q} cents.", f"Dimes: {d} * 10 = {10 * d} cents.", f"Nickels: {n} * 5 = {5 * n} cents.",
             f"Total: {25 * q} + {10 * d} + {5 * n} = {ans} cents."], ans)


def t_perimeter_fence(r):
    w, l, post = int(r.integers(4, 30)), int(r.integers(4, 30)), int(r.integers(2, 7))
    per = 2 * (w + l); ans = per * post
    return (f"A field is {w} m by {l} m. Fencing costs ${post} per metre. How much does it cost to fence the whole field?",
            [f"The perimeter is 2 * ({w} + {l}) = {per} m.", f"The cost is {per} * {post} = {ans} dollars."], ans)


def t_two_step_sales(r):
    n, mon = r.choice(NAMES), int(r.integers(5, 30)); mult = int(r.integers(2, 4)); less = int(r.integers(1, 5))
    tue = mon * mult; wed = tue - less; ans = mon + tue + wed
    return (f"{n} sold {mon} cups of lemonade on Monday, {mult} times as many on Tuesday, and {less} fewer on Wednesday "
            f"than on Tuesday. How many cups did {n} sell in the three days?",
            [f"Tuesday: {mon} * {mult} = {tue}.", f"Wednesday: {tue} - {less} = {wed}.", f"Total: {mon} + {tue} + {wed} = {ans}."], ans)


def t_class_groups(r):
    g, b, size = int(r.integers(8, 20)), int(r.integers(8, 20)), int(r.choice([2, 3, 4]))
    tot = g + b; tot -= tot % size; b = tot - g
    if b <= 0:
        b, tot = size, g + size - (g % size) if g % size else g + size
        b = tot - g
    ans = tot // size
    return (f"A class has {g} girls and {b} boys. The teacher makes groups of {size}. How many groups are there?",
            [f"There are {g} + {b} = {tot} students.", f"Groups: {tot} / {size} = {ans}."], ans)


def t_interest(r):
    p, rate, y = int(r.integers(1, 20)) * 100, int(r.choice([2, 3, 4, 5, 10])), int(r.integers(1, 6))
    interest = p * rate * y // 100; ans = p + interest
    return (f"{r.choice(NAMES)} puts ${p} in an account paying {rate}% simple interest per year. "
            f"How many dollars are in the account after {y} years?",
            [f"Yearly interest: {rate}% of {p} = {p * rate // 100}.", f"Over {y} years: {p * rate // 100} * {y} = {interest}.",
             f"Balance: {p} + {interest} = {ans} dollars."], ans)


def t_remaining_money(r):
    n, m = r.choice(NAMES), int(r.integers(40, 200)); a = int(r.integers(5, 20)); k = int(r.integers(2, 4))
    spend = a * k
    while spend >= m:
        m += 50
    half = (m - spend) // 2 if (m - spend) % 2 == 0 else None
    if half is None:
        m += 1; half = (m - spend) // 2
    return (f"{n} has ${m}. {n} buys {k} shirts at ${a} each and then spends half of the remaining money on food. "
            f"How many dollars does {n} have left?",
            [f"Shirts cost {k} * {a} = {spend}.", f"Remaining: {m} - {spend} = {m - spend}.",
             f"After food: {m - spend} / 2 = {half}."], half)


def t_distance_walk(r):
    laps, length, days = int(r.integers(2, 10)), int(r.choice([200, 250, 400, 500])), int(r.integers(2, 7))
    ans = laps * length * days
    return (f"{r.choice(NAMES)} runs {laps} laps of a {length} m track every day for {days} days. How many metres is that?",
            [f"Each day: {laps} * {length} = {laps * length} m.", f"Over {days} days: {laps * length} * {days} = {ans} m."], ans)


TEMPLATES = [t_shopping, t_share, t_age, t_speed, t_percent_discount, t_rectangle, t_weekly_savings, t_pages, t_boxes,
             t_wages, t_fraction, t_tickets, t_average, t_train_time, t_legs, t_recipe, t_consecutive, t_tank, t_coins,
             t_perimeter_fence, t_two_step_sales, t_class_groups, t_interest, t_remaining_money, t_distance_walk]
# Templates whose problems appear only in evaluation (never in training/validation data).
HELD_OUT = ("t_coins", "t_interest", "t_remaining_money", "t_two_step_sales", "t_perimeter_fence", "t_legs")


def generate(template: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` problems of one template: ``dict(id, template, question, answer (worked, ends '#### N'), number)``.

    Deterministic in (template, n, seed); duplicates (same question text) are dropped, so fewer than ``n`` may
    come back for templates with a small parameter space.
    """
    fns = {f.__name__: f for f in TEMPLATES}
    if template not in fns:
        raise ValueError(f"unknown maths template {template!r}; known: {sorted(fns)}")
    rng = np.random.default_rng([seed, zlib.crc32(template.encode())])
    out, seen = [], set()
    for _ in range(n * 4):
        q, steps, ans = fns[template](rng)
        if q in seen:
            continue
        seen.add(q)
        out.append(dict(id=f"gsm-{template}-{len(out)}", template=template, question=q,
                        answer=" ".join(steps) + f"\n#### {_fmt(ans)}", number=_fmt(ans)))
        if len(out) == n:
            break
    return out


def final_number(text: str) -> str | None:
    """The number after the last ``####`` (or else the last number) in a generated answer, normalised."""
    import re

    m = re.findall(r"####\s*\$?(-?[\d,]*\.?\d+)", text)
    if not m:
        m = re.findall(r"(-?[\d,]*\.?\d+)", text)
    if not m:
        return None
    try:
        return _fmt(float(m[-1].replace(",", "")))
    except ValueError:
        return None
