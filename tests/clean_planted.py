"""A planted corpus for the quality filters, generated from a seed (nothing stored in git): clean text of the kinds
the shipped configs are meant for (English prose and books for `web`, math for `edu`, source code for `code`,
Chinese prose and poem anthologies for `chinese`) and low-quality kinds each config must still catch.

The generators vary structure on purpose (punctuation, numbers, parentheses, quotes, headings, blank lines, inline and
display formulas, comments), so that a rule counting characters or tokens the published rule does not count shows up
as dropped clean text."""

from __future__ import annotations

import random

NOUNS = ("river", "city", "market", "teacher", "garden", "engine", "village", "report", "season", "harbor", "bridge",
         "farmer", "letter", "museum", "council", "forest", "library", "storm", "painter", "railway", "station",
         "mountain", "doctor", "family", "school", "window", "kitchen", "island", "factory", "journey", "question",
         "harvest", "soldier", "castle", "student", "century", "history", "theory", "surface", "pattern", "method",
         "result", "energy", "planet", "signal", "record", "office", "picture", "company", "country", "problem")
VERBS = ("built", "crossed", "found", "opened", "followed", "described", "carried", "changed", "measured", "reached",
         "watched", "closed", "repaired", "studied", "visited", "explained", "painted", "collected", "divided",
         "replaced", "improved", "reported", "tested", "moved", "wrote", "kept", "left", "held", "brought", "saw")
ADJS = ("old", "quiet", "narrow", "bright", "large", "careful", "northern", "small", "early", "heavy", "modern",
        "simple", "local", "famous", "empty", "strange", "gentle", "ancient", "public", "second", "final", "cold")
ADVS = ("slowly", "finally", "often", "never", "quickly", "carefully", "later", "soon", "rarely", "again")
NAMES = ("Anna", "Thomas", "Maria", "Henry", "Clara", "James", "Elena", "Samuel", "Ruth", "Oliver", "Grace", "Peter")
PLACES = ("Lyon", "Boston", "Kyoto", "Oslo", "Lima", "Cairo", "Dublin", "Porto", "Quebec", "Geneva", "Madras")
CONNECT = ("and", "but", "so", "because", "while", "although", "when", "after", "before", "since")


class English:
    def __init__(self, rng: random.Random):
        self.r = rng

    def np(self) -> str:
        r = self.r
        head = r.choice(NOUNS) + ("s" if r.random() < 0.3 else "")
        if r.random() < 0.5:
            head = r.choice(ADJS) + " " + head
        if r.random() < 0.15:
            head = r.choice(ADJS) + "-" + r.choice(NOUNS) + " " + r.choice(NOUNS)
        return r.choice(("the", "a", "this", "that", "every", "their", "our")) + " " + head

    def clause(self) -> str:
        r = self.r
        subject = r.choice(NAMES) if r.random() < 0.3 else self.np()
        parts = [subject, r.choice(ADVS)] if r.random() < 0.2 else [subject]
        parts += [r.choice(VERBS), self.np()]
        roll = r.random()
        if roll < 0.25:
            parts.append(f"in {r.choice(PLACES)}")
        elif roll < 0.4:
            parts.append(f"in {r.randint(1780, 2023)}")
        elif roll < 0.5:
            parts.append(f"for {r.randint(2, 900):,} {r.choice(('dollars', 'years', 'miles', 'people'))}")
        elif roll < 0.58:
            parts.append(f"({r.choice(('see', 'cf.', 'about'))} {r.choice(NOUNS)} {r.randint(1, 40)})")
        elif roll < 0.64:
            parts.append(f"at {r.randint(1, 99)}.{r.randint(0, 9)} % of the {r.choice(NOUNS)}")
        return " ".join(parts)

    def sentence(self) -> str:
        r = self.r
        s = self.clause()
        roll = r.random()
        if roll < 0.35:
            s += f", {r.choice(CONNECT)} {self.clause()}"
        elif roll < 0.45:
            s += f"; {self.clause()}"
        elif roll < 0.55:
            later = self.clause()
            return f"\"{s[0].upper() + s[1:]},\" {r.choice(NAMES)} said. \"{later[0].upper() + later[1:]}.\""
        return s[0].upper() + s[1:] + r.choice((".", ".", ".", ".", "?", "!"))

    def paragraph(self, lo: int = 3, hi: int = 7) -> str:
        return " ".join(self.sentence() for _ in range(self.r.randint(lo, hi)))

    def web_page(self) -> str:
        r = self.r
        blocks = []
        if r.random() < 0.7:
            blocks.append(f"{r.choice(ADJS).capitalize()} {r.choice(NOUNS)}s of {r.choice(PLACES)}")
        for _ in range(r.randint(3, 7)):
            blocks.append(self.paragraph())
            if r.random() < 0.25:
                blocks.append(f"The {r.choice(NOUNS)} in numbers")
        return ("\n\n" if r.random() < 0.6 else "\n").join(blocks)

    def book(self) -> str:
        r = self.r
        lines = [f"Chapter {r.randint(1, 30)}"]
        for _ in range(r.randint(6, 12)):
            if r.random() < 0.3:
                lines.append(f"\"{self.clause().capitalize()}?\" asked {r.choice(NAMES)}. \"{self.clause()}.\"")
            else:
                lines.append(self.paragraph(3, 6))
        return "\n".join(lines)


def _num(r: random.Random) -> int:
    return r.randint(2, 19)


class Math:
    def __init__(self, rng: random.Random):
        self.r = rng
        self.en = English(rng)

    def formula(self) -> str:
        r = self.r
        a, b, c = _num(r), _num(r), _num(r)
        x = r.choice("xyztn")
        return r.choice((
            f"{a}{x}^2 + {b}{x} - {c} = 0", f"f({x}) = {a}{x} + {b}", f"\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{a}}}",
            f"\\int_0^{{{a}}} {x}^{b} \\, d{x}", f"\\sum_{{k=1}}^{{{a}}} k^{b}", f"{x}_{{n+1}} = {a}{x}_n - {b}",
            f"\\sqrt{{{a * a}}} = {a}", f"({x} - {a})({x} + {b})", f"P(A \\cap B) = 0.{a}", f"{a} \\cdot {b} = {a * b}",
            f"\\lim_{{{x} \\to 0}} \\frac{{\\sin {a}{x}}}{{{x}}} = {a}", f"|{x} - {a}| < {b}"))

    def sentence(self) -> str:
        """Built from parts, so that two sentences of a document rarely share a 5-gram (as in written math)."""
        r = self.r
        if r.random() < 0.35:
            return self.en.sentence()
        opener = r.choice(("Let", "Suppose", "Assume that", "Recall that", "Consider", "Observe that", "Hence",
                           "By the previous lemma,", "In this case", "Similarly,", "From the definition,", "Thus",
                           "We know that", "It is easy to check that", "Write", "Now"))
        link = r.choice(("and", "so", "which gives", "hence", "where", "since", "so that", "because", "while",
                         "and therefore", "which means", "implying"))
        tail = r.choice((f"${self.formula()}$", f"the {r.choice(ADJS)} {r.choice(('term', 'factor', 'bound',
                         'limit', 'sum', 'root', 'case', 'integral'))} is ${self.formula()}$",
                         f"{r.choice(NAMES)} {r.choice(VERBS)} the {r.choice(('proof', 'table', 'estimate', 'graph'))}",
                         f"we may take ${r.choice('xyzn')} = {_num(r)}$"))
        return f"{opener} ${self.formula()}$ {link} {tail}."

    def document(self) -> str:
        r = self.r
        kind = r.choice(("Example", "Theorem", "Exercise", "Section", "Lemma"))
        out = [f"{kind} {r.randint(1, 9)}.{r.randint(1, 9)}"]
        for _ in range(r.randint(4, 8)):
            out.append(" ".join(self.sentence() for _ in range(r.randint(2, 5))))
            roll = r.random()
            if roll < 0.4:
                out.append(f"$$ {self.formula()}, \\quad {self.formula()} $$")
            elif roll < 0.6:
                out += [f"{i}. Solve ${self.formula()}$." for i in range(1, r.randint(3, 5))]
        return "\n".join(out)


IDENTS = ("value", "count", "items", "total", "index", "result", "buffer", "node", "path", "config", "size", "name",
          "offset", "record", "cache", "queue", "token", "limit", "width", "height", "score", "label", "row", "key")


class Code:
    def __init__(self, rng: random.Random):
        self.r = rng

    def ident(self) -> str:
        r = self.r
        return "_".join(r.sample(IDENTS, r.randint(1, 2)))

    def python(self) -> str:
        r = self.r
        out = [f"import {r.choice(('os', 'json', 're', 'math', 'sys'))}", ""]
        for _ in range(r.randint(2, 5)):
            name, arg, other = self.ident(), self.ident(), self.ident()
            out += [f"def {name}({arg}, {other}={r.randint(0, 99)}):",
                    f"    \"\"\"Return the {r.choice(IDENTS)} of {arg}.\"\"\"",
                    f"    {name}_out = []",
                    f"    for i, item in enumerate({arg}):",
                    f"        if item > {other} * {r.randint(2, 9)}:  # {r.choice(('skip', 'keep'))} large ones",
                    f"            {name}_out.append(item - i)",
                    f"    return {{'{r.choice(IDENTS)}': {name}_out, 'n': len({name}_out)}}", ""]
        return "\n".join(out)

    def c(self) -> str:
        r = self.r
        out = ["#include <stdio.h>", "#include <stdlib.h>", ""]
        for _ in range(r.randint(2, 4)):
            name, arg = self.ident(), self.ident()
            out += [f"static int {name}(const int *{arg}, size_t n) {{",
                    "    int acc = 0;",
                    f"    for (size_t i = 0; i < n; ++i) {{  /* {r.choice(IDENTS)} */",
                    f"        acc += {arg}[i] * {r.randint(2, 64)} % {r.randint(3, 97)};",
                    "    }",
                    "    return acc;", "}", ""]
        return "\n".join(out)

    def document(self) -> str:
        return self.python() if self.r.random() < 0.5 else self.c()


ZH_NOUNS = tuple("学校 老师 学生 城市 历史 文化 经济 社会 问题 方法 技术 国家 时间 朋友 "
                 "家庭 工作 生活 世界 科学 研究 发展 环境 教育 市场 政府 企业 农村 作品 "
                 "语言 山水 春天 故事 道路 医院 图书馆 实验 数据 结果 计划 地区".split())
ZH_VERBS = tuple("讨论 研究 发现 提出 改变 支持 建立 介绍 分析 解决 完成 参加 推动 "
                 "保护 理解 学习 说明 影响 组织 记录".split())
ZH_ADJS = tuple("重要 新的 传统 复杂 年轻 美丽 主要 基本 普通 特别 安静 古老".split())
ZH_SUBJ = tuple("我们 他们 这位老师 研究人员 当地居民 许多学生 政府部门 这家企业 作者".split())
ZH_ADV = ("已经", "正在", "一直", "终于", "经常", "认真地", "逐渐", "共同")
POETS = ("李白", "杜甫", "王维", "白居易", "苏轼", "李清照", "孟浩然", "王昌龄")
ZH_CHARS = "山水月花风云春秋江河天地日夜雪雨鸟声人家心归远行明清长空树草烟灯楼酒舟城门"


class Chinese:
    def __init__(self, rng: random.Random):
        self.r = rng

    def sentence(self) -> str:
        r = self.r
        s = f"{r.choice(ZH_SUBJ)}{r.choice(ZH_ADV)}{r.choice(ZH_VERBS)}了{r.choice(ZH_ADJS)}{r.choice(ZH_NOUNS)}"
        if r.random() < 0.5:
            s += f"，{r.choice(('因为', '而且', '所以', '但是'))}{r.choice(ZH_NOUNS)}的{r.choice(ZH_NOUNS)}" \
                 f"{r.choice(('非常', '比较', '十分'))}{r.choice(ZH_ADJS)}"
        if r.random() < 0.2:
            s += f"（{r.randint(1950, 2023)}年）"
        return s + r.choice(("。", "。", "。", "！", "？"))

    def prose(self) -> str:
        r = self.r
        paras = ["".join(self.sentence() for _ in range(r.randint(3, 7))) for _ in range(r.randint(3, 7))]
        if r.random() < 0.5:
            paras.insert(0, f"{r.choice(ZH_ADJS)}的{r.choice(ZH_NOUNS)}")
        return "\n".join(paras)

    def verse(self, n: int) -> str:
        return "".join(self.r.choice(ZH_CHARS) for _ in range(n))

    def anthology(self) -> str:
        """Poems with their title and poet: a poet appears more than once, as in any anthology."""
        r = self.r
        out = []
        for _ in range(r.randint(4, 8)):
            n = r.choice((5, 7))
            out += [f"《{self.verse(r.randint(2, 4))}》", f"{r.choice(('唐', '宋'))}·{r.choice(POETS)}"]
            out += [f"{self.verse(n)}，{self.verse(n)}。" for _ in range(r.choice((2, 4)))]
            out.append("")
        return "\n".join(out).strip()


class LowQuality:
    """Kinds a quality filter exists to catch; each generator varies its content."""

    def __init__(self, rng: random.Random):
        self.r = rng
        self.en = English(rng)
        self.zh = Chinese(rng)

    def short(self) -> str:
        return self.en.sentence()[:self.r.randint(10, 45)]

    def symbols(self) -> str:
        r = self.r
        return "\n".join(" ".join("".join(r.choice("#$%&*@!~^+=<>|{}[]") for _ in range(r.randint(2, 7)))
                                  for _ in range(r.randint(8, 15))) for _ in range(r.randint(8, 15)))

    def repeated_lines(self) -> str:
        line = self.en.sentence()
        return "\n".join([line] * self.r.randint(8, 20) + [self.en.paragraph()])

    def menu(self) -> str:
        r = self.r
        items = [f"{r.choice(ADJS).capitalize()} {r.choice(NOUNS).capitalize()}" for _ in range(r.randint(25, 45))]
        items.insert(r.randint(0, len(items)), "Accept all cookies | Privacy policy | Terms of use")
        return "\n".join(items)

    def keywords(self) -> str:
        r = self.r
        words = list(NOUNS + ADJS)
        return " ".join(f"{r.choice(words)} {r.choice(words)} {r.choice(PLACES).lower()} cheap best"
                        for _ in range(r.randint(30, 60)))

    def lorem(self) -> str:
        return "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " + self.en.paragraph(6, 10)

    def ellipses(self) -> str:
        return "\n".join(f"{self.en.clause().capitalize()}..." for _ in range(self.r.randint(10, 20)))

    def bullets(self) -> str:
        return "\n".join(f"- {self.en.np()} {self.r.choice(VERBS)}" for _ in range(self.r.randint(15, 30)))

    def control_chars(self) -> str:
        text = list(self.en.paragraph(6, 9))
        for _ in range(len(text) // 40):
            text[self.r.randrange(len(text))] = chr(self.r.choice((1, 2, 3, 7, 8, 0x1b, 0x7f)))
        return "".join(text)

    def replacement_chars(self) -> str:
        text = list(self.en.paragraph(6, 9))
        for _ in range(len(text) // 50):
            text[self.r.randrange(len(text))] = "\ufffd"
        return "".join(text)

    def number_table(self) -> str:
        r = self.r
        rows = [f"{r.choice(NOUNS)} {r.randint(1, 999)} {r.randint(1, 99)}.{r.randint(0, 99):02d} "
                f"{r.randint(1, 12)}/{r.randint(1, 28)} {r.randint(100, 9999)} {r.randint(0, 9)}"
                for _ in range(r.randint(15, 30))]
        return "The price list for the store, with the stock and the date of each item:\n" + "\n".join(rows)

    def hashtags(self) -> str:
        r = self.r
        return " ".join(f"#{r.choice(NOUNS)}{r.choice(ADJS)} #{r.choice(PLACES).lower()} the best of {r.choice(NOUNS)}"
                        for _ in range(r.randint(20, 40)))

    def zh_repeated(self) -> str:
        line = self.zh.sentence()
        return "\n".join([line] * self.r.randint(8, 20) + [self.zh.sentence()])

    def zh_short(self) -> str:
        return self.zh.sentence()[:self.r.randint(8, 40)]

    def zh_mojibake(self) -> str:
        r = self.r
        junk = r.choice(("锟斤拷", "烫烫烫", "屯屯屯"))
        return "".join(junk * r.randint(3, 12) + (self.zh.sentence() if r.random() < 0.5 else "")
                       for _ in range(r.randint(10, 20)))

    def zh_list(self) -> str:
        return "\n".join(f"{self.r.choice(ZH_NOUNS)}{self.r.choice(ZH_NOUNS)}" for _ in range(self.r.randint(20, 40)))


def planted(seed: int, per_kind: int) -> dict[str, list[str]]:
    """kind -> documents. Clean kinds are named `clean:<config>:<kind>`, low-quality ones `low:<config>:<kind>`."""
    r = random.Random(seed)
    en, math, code, zh, low = English(r), Math(r), Code(r), Chinese(r), LowQuality(r)
    out: dict[str, list[str]] = {
        "clean:web:prose": [en.web_page() for _ in range(per_kind)],
        "clean:web:book": [en.book() for _ in range(per_kind)],
        "clean:edu:prose": [en.web_page() for _ in range(per_kind)],
        "clean:edu:math": [math.document() for _ in range(per_kind)],
        "clean:code:code": [code.document() for _ in range(per_kind)],
        "clean:chinese:prose": [zh.prose() for _ in range(per_kind)],
        "clean:chinese:anthology": [zh.anthology() for _ in range(per_kind)],
    }
    kinds_en = ("short", "symbols", "repeated_lines", "menu", "keywords", "lorem", "ellipses", "bullets",
                "control_chars", "replacement_chars", "number_table", "hashtags")
    kinds_zh = ("zh_repeated", "zh_short", "zh_mojibake", "zh_list", "replacement_chars")
    for config in ("web", "edu"):
        for kind in kinds_en:
            out[f"low:{config}:{kind}"] = [getattr(low, kind)() for _ in range(per_kind)]
    for kind in kinds_zh:
        out[f"low:chinese:{kind}"] = [getattr(low, kind)() for _ in range(per_kind)]
    for kind in ("short", "control_chars", "replacement_chars"):
        out[f"low:code:{kind}"] = [getattr(low, kind)() for _ in range(per_kind)]
    return out
