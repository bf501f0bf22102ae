//! The DRA CEL device selectors operators write, evaluated against one device.
//!
//! The subset: `device.driver`; `device.attributes[D].name`, `device.attributes[D]["name"]` and the
//! same for `device.capacity`; `has(device.attributes[D].name)` and `"name" in device.attributes[D]`;
//! `quantity("…")` with `.compareTo()`, `.isGreaterThan()` and `.isLessThan()`; strings'
//! `.contains()`, `.startsWith()` and `.endsWith()`; `x in [..]`; `!`,
//! `&&`, `||`, `==`, `!=`, `<`, `<=`, `>`, `>=`; bool, int and string literals. Values follow
//! cel-go as Kubernetes runs it: a missing domain is an empty map (so a missing attribute is
//! `no such key`), `==` between an attribute and a value of another type is false (heterogeneous
//! equality), ordering across types is an error. Anything else (other functions, macros, arithmetic,
//! `?:`, version attributes, quantities our [`Quantity`] refuses) is reported as
//! [`Verdict::Unknown`] naming the construct, never guessed.
//!
//! Parsed by hand, not with the `cel` crate: its parser is ANTLR-generated and comes with the crate's
//! whole interpreter and the antlr4rust runtime, for the small grammar above; migdra's evaluator
//! would keep its own rules (exact or unknown) on that AST either way. When the subset grows toward
//! CEL's string and list functions, that parser is the better base.

use super::wire::{Attribute, Value as Amount};
use crate::mig::devices::Quantity;
use std::collections::BTreeMap;
use std::ops::Range;

/// A parsed selector.
#[derive(Debug, Clone)]
pub struct Selector {
    expression: String,
    /// The AST, or what puts the expression outside the subset.
    ast: Result<Expr, String>,
}

/// What a selector says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Evaluates to true.
    Match,
    /// Evaluates to false.
    NoMatch,
    /// A CEL runtime error on this device (e.g. `no such key: slurmGpuIndex`), which makes the
    /// scheduler abort the claim's allocation.
    Error(String),
    /// Outside the subset this module evaluates: the reason names the construct. Never a guess.
    Unknown(String),
}

/// The device as a selector sees it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceInput<'a> {
    pub driver: &'a str,
    pub attributes: &'a BTreeMap<String, Attribute>,
    pub capacity: &'a BTreeMap<String, Amount>,
}

impl Selector {
    /// Never fails: an expression outside the subset parses to a selector whose every verdict is
    /// `Unknown` naming what is unsupported.
    pub fn parse(expression: &str) -> Self {
        let ast = tokenize(expression)
            .and_then(|toks| Parser { toks, pos: 0, len: expression.len() }.all())
            .map_err(|e| format!("unsupported CEL: {e}"));
        Self { expression: expression.to_string(), ast }
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn eval(&self, device: &DeviceInput<'_>) -> Verdict {
        match &self.ast {
            Ok(e) => verdict(e, device),
            Err(reason) => Verdict::Unknown(reason.clone()),
        }
    }

    /// The selector without its top-level `&&` conjuncts that read attribute `name` (in any
    /// domain); `None` when nothing would be left (every conjunct reads it) or when the selector is
    /// unsupported. Used to ask "where would it fit without the Slurm pin (`slurmGpuIndex`)".
    pub fn without_attribute(&self, name: &str) -> Option<Selector> {
        let ast = self.ast.as_ref().ok()?;
        let Expr::And(parts) = ast else { return (!ast.reads(name)).then(|| self.clone()) };
        let kept: Vec<&str> =
            parts.iter().filter(|(e, _)| !e.reads(name)).filter_map(|(_, r)| self.expression.get(r.clone())).collect();
        (!kept.is_empty()).then(|| Selector::parse(&kept.join(" && ")))
    }

    /// The literal a top-level `&&` conjunct of the form `device.attributes[D].name == <literal>`
    /// (either operand order) or `device.attributes[D].name in [<literal>]` (a list of one: the same
    /// pin) compares attribute `name` with, as text (strings without quotes, ints in decimal); e.g.
    /// `pinned("profile") == Some("3g.40gb")`, `pinned("slurmGpuIndex") == Some("3")`.
    pub fn pinned(&self, name: &str) -> Option<String> {
        let parts = match self.ast.as_ref().ok()? {
            Expr::And(parts) => parts.iter().map(|(e, _)| e).collect(),
            e => vec![e],
        };
        let text = |v: &Val| match v {
            Val::Str(s) => Some(s.clone()),
            Val::Int(i) => Some(i.to_string()),
            Val::Bool(b) => Some(b.to_string()),
            _ => None,
        };
        parts.into_iter().find_map(|e| match e {
            Expr::Cmp("==", a, b) => match (&**a, &**b) {
                (Expr::Lookup(Map::Attributes, _, n), Expr::Lit(v))
                | (Expr::Lit(v), Expr::Lookup(Map::Attributes, _, n))
                    if n == name =>
                {
                    text(v)
                }
                _ => None,
            },
            Expr::In(a, b) => match (&**a, &**b) {
                (Expr::Lookup(Map::Attributes, _, n), Expr::List(items)) if n == name => match items.as_slice() {
                    [Expr::Lit(v)] => text(v),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        })
    }
}

/// Which of the device's two maps a lookup reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Map {
    Attributes,
    Capacity,
}

/// The methods of Kubernetes' quantity library this module evaluates.
/// Quantity's comparisons, and CEL's string tests (a selector of the project's own examples reads
/// `profile.contains("+")`).
const METHODS: [&str; 6] = ["compareTo", "isGreaterThan", "isLessThan", "contains", "startsWith", "endsWith"];

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Lit(Val),
    List(Vec<Expr>),
    Driver,
    /// `device` and `device.attributes`/`device.capacity`: steps of a path, never values.
    Device,
    Root(Map),
    /// `device.attributes[D]`: a step of a path, never a value.
    Domain(Map, String),
    Lookup(Map, String, String),
    /// `has(device.attributes[D].name)`, or `"name" in device.attributes[D]`.
    Has(Map, String, String),
    Quantity(String),
    Not(Box<Expr>),
    /// Each conjunct keeps its source text's range, so `without_attribute` can drop one verbatim.
    And(Vec<(Expr, Range<usize>)>),
    Or(Vec<Expr>),
    /// The operator as written: `==`, `!=`, `<`, `<=`, `>`, `>=`.
    Cmp(&'static str, Box<Expr>, Box<Expr>),
    In(Box<Expr>, Box<Expr>),
    Method(&'static str, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Whether any part of the expression reads (or tests for) attribute `name`, in any domain.
    fn reads(&self, name: &str) -> bool {
        match self {
            Expr::Lookup(Map::Attributes, _, n) | Expr::Has(Map::Attributes, _, n) => n == name,
            Expr::Cmp(_, a, b) | Expr::In(a, b) | Expr::Method(_, a, b) => a.reads(name) || b.reads(name),
            Expr::Not(x) => x.reads(name),
            Expr::And(parts) => parts.iter().any(|(e, _)| e.reads(name)),
            Expr::Or(parts) | Expr::List(parts) => parts.iter().any(|e| e.reads(name)),
            _ => false,
        }
    }
}

/// A value, typed as CEL types it.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bool(bool),
    Int(i64),
    Str(String),
    /// A semver attribute: only presence tests are evaluated on it.
    Version,
    /// A quantity in base units (bytes or a count).
    Quantity(u128),
    List(Vec<Val>),
}

impl Val {
    fn type_name(&self) -> &'static str {
        match self {
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Str(_) => "string",
            Val::Version => "kubernetes.Semver",
            Val::Quantity(_) => "kubernetes.Quantity",
            Val::List(_) => "list",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Punct(&'static str),
}

/// The operators the parser knows, and those it names when refusing them; longest first.
const PUNCT: [&str; 24] = [
    "==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "(", ")", "[", "]", ".", ",", "-", "+", "*", "/", "%", "?", ":",
    "{", "}",
];

fn tokenize(src: &str) -> Result<Vec<(Tok, Range<usize>)>, String> {
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(c) = src[i..].chars().next() {
        let (rest, start) = (&src[i..], i);
        let word = |more: fn(char) -> bool| rest.find(|c: char| !more(c)).unwrap_or(rest.len());
        let tok = if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        } else if c == '"' || c == '\'' {
            let (s, len) = string(rest, c)?;
            i += len;
            Tok::Str(s)
        } else if c.is_ascii_digit() {
            // Digits run on into letters and dots so that 1.5, 3u and 0x1F are refused whole.
            let len = word(|c| c.is_ascii_alphanumeric() || c == '.');
            i += len;
            Tok::Int(rest[..len].parse().map_err(|_| format!("number literal {}", &rest[..len]))?)
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = word(|c| c.is_ascii_alphanumeric() || c == '_');
            i += len;
            Tok::Ident(rest[..len].to_string())
        } else if let Some(p) = PUNCT.iter().find(|p| rest.starts_with(**p)) {
            i += p.len();
            Tok::Punct(p)
        } else {
            return Err(format!("character {c:?}"));
        };
        toks.push((tok, start..i));
    }
    Ok(toks)
}

/// A quoted string at the start of `rest`, and its length in bytes with the quotes.
fn string(rest: &str, quote: char) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut chars = rest.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        match c {
            _ if c == quote => return Ok((out, i + 1)),
            '\\' => match chars.next() {
                Some((_, e @ ('\\' | '"' | '\''))) => out.push(e),
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, 'r')) => out.push('\r'),
                e => return Err(format!("string escape \\{}", e.map_or(' ', |e| e.1))),
            },
            '\n' | '\r' => break,
            _ => out.push(c),
        }
    }
    Err("unterminated string".into())
}

struct Parser {
    toks: Vec<(Tok, Range<usize>)>,
    pos: usize,
    /// The source's length: where a missing token would have started.
    len: usize,
}

impl Parser {
    fn all(mut self) -> Result<Expr, String> {
        let e = self.or()?;
        if self.pos < self.toks.len() {
            return Err(self.unexpected());
        }
        Ok(e)
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.0)
    }

    fn eat(&mut self, p: &str) -> bool {
        let hit = matches!(self.peek(), Some(Tok::Punct(q)) if *q == p);
        self.pos += usize::from(hit);
        hit
    }

    fn expect(&mut self, p: &str) -> Result<(), String> {
        if self.eat(p) { Ok(()) } else { Err(self.unexpected()) }
    }

    /// Names the construct at the current token, for the `Unknown` reason.
    fn unexpected(&self) -> String {
        match self.peek() {
            None => "unexpected end of expression".into(),
            Some(Tok::Punct(p @ ("+" | "-" | "*" | "/" | "%"))) => format!("arithmetic '{p}'"),
            Some(Tok::Punct("?" | ":")) => "ternary ?:".into(),
            Some(Tok::Punct("{" | "}")) => "map literal".into(),
            Some(Tok::Punct(p)) => format!("unexpected '{p}'"),
            Some(Tok::Ident(s)) => format!("unexpected identifier {s}"),
            Some(Tok::Str(s)) => format!("unexpected string {s:?}"),
            Some(Tok::Int(i)) => format!("unexpected number {i}"),
        }
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut parts = vec![self.and()?];
        while self.eat("||") {
            parts.push(self.and()?);
        }
        Ok(match <[_; 1]>::try_from(parts) {
            Ok([e]) => e,
            Err(parts) => Expr::Or(parts),
        })
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut parts = Vec::new();
        loop {
            let start = self.toks.get(self.pos).map_or(self.len, |t| t.1.start);
            let e = self.rel()?;
            let end = self.toks.get(self.pos.wrapping_sub(1)).map_or(start, |t| t.1.end);
            parts.push((e, start..end));
            if !self.eat("&&") {
                break;
            }
        }
        Ok(match <[_; 1]>::try_from(parts) {
            Ok([(e, _)]) => e,
            Err(parts) => Expr::And(parts),
        })
    }

    /// Relations are left-associative, as in CEL's grammar.
    fn rel(&mut self) -> Result<Expr, String> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Ident(s)) if s == "in" => None,
                Some(Tok::Punct(p @ ("==" | "!=" | "<" | "<=" | ">" | ">="))) => Some(*p),
                _ => return Ok(left),
            };
            self.pos += 1;
            let right = self.unary()?;
            left = match (op, left, right) {
                (Some(op), l, r) => Expr::Cmp(op, Box::new(l), Box::new(r)),
                (None, Expr::Lit(Val::Str(name)), Expr::Domain(map, domain)) => Expr::Has(map, domain, name),
                (None, l, r) => Expr::In(Box::new(l), Box::new(r)),
            };
        }
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            return match self.peek() {
                Some(Tok::Int(n)) => {
                    let n = -*n;
                    self.pos += 1;
                    Ok(Expr::Lit(Val::Int(n)))
                }
                _ => Err("arithmetic negation '-'".into()),
            };
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, String> {
        let mut e = self.primary()?;
        loop {
            if self.eat(".") {
                let Some(Tok::Ident(name)) = self.peek().cloned() else { return Err(self.unexpected()) };
                self.pos += 1;
                e = if self.eat("(") { self.method(e, &name)? } else { field(e, name)? };
            } else if self.eat("[") {
                let key = self.or()?;
                self.expect("]")?;
                e = index(e, key)?;
            } else if matches!(e, Expr::Device | Expr::Root(_)) {
                return Err("`device` or a whole map of it as a value".into());
            } else {
                return Ok(e);
            }
        }
    }

    fn method(&mut self, receiver: Expr, name: &str) -> Result<Expr, String> {
        let Some(method) = METHODS.into_iter().find(|m| *m == name) else { return Err(format!("method .{name}()")) };
        let arg = self.or()?;
        self.expect(")")?;
        Ok(Expr::Method(method, Box::new(receiver), Box::new(arg)))
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let Some(tok) = self.peek().cloned() else { return Err(self.unexpected()) };
        self.pos += 1;
        match tok {
            Tok::Int(n) => Ok(Expr::Lit(Val::Int(n))),
            Tok::Str(s) => Ok(Expr::Lit(Val::Str(s))),
            Tok::Punct("(") => {
                let e = self.or()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Punct("[") => {
                let mut items = Vec::new();
                while !self.eat("]") {
                    items.push(self.or()?);
                    if !self.eat(",") {
                        self.expect("]")?;
                        break;
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Ident(id) => match id.as_str() {
                "true" | "false" => Ok(Expr::Lit(Val::Bool(id == "true"))),
                "device" => Ok(Expr::Device),
                "has" if self.eat("(") => {
                    let inner = self.postfix()?;
                    // CEL's has() takes a field selection: `.name`, not `["name"]`.
                    let selected = matches!(self.toks.get(self.pos.wrapping_sub(2)), Some((Tok::Punct("."), _)));
                    self.expect(")")?;
                    match inner {
                        Expr::Lookup(map, domain, name) if selected => Ok(Expr::Has(map, domain, name)),
                        _ => Err("has() of anything but device.attributes[D].name".into()),
                    }
                }
                "quantity" if self.eat("(") => match (self.peek().cloned(), self.toks.get(self.pos + 1)) {
                    (Some(Tok::Str(s)), Some((Tok::Punct(")"), _))) => {
                        self.pos += 2;
                        Ok(Expr::Quantity(s))
                    }
                    _ => Err("quantity() of anything but a string literal".into()),
                },
                _ if matches!(self.peek(), Some(Tok::Punct("("))) => Err(format!("function {id}()")),
                _ => Err(format!("identifier {id}")),
            },
            _ => {
                self.pos -= 1;
                Err(self.unexpected())
            }
        }
    }
}

/// `.name` on a path: `device.driver`, `device.attributes`, or an entry of a map.
fn field(e: Expr, name: String) -> Result<Expr, String> {
    match (e, name.as_str()) {
        (Expr::Device, "driver") => Ok(Expr::Driver),
        (Expr::Device, "attributes") => Ok(Expr::Root(Map::Attributes)),
        (Expr::Device, "capacity") => Ok(Expr::Root(Map::Capacity)),
        (Expr::Root(map), _) => Ok(Expr::Domain(map, name)),
        (Expr::Domain(map, domain), _) => Ok(Expr::Lookup(map, domain, name)),
        _ => Err(format!("field .{name}")),
    }
}

/// `[key]` on a map: only string literal keys.
fn index(e: Expr, key: Expr) -> Result<Expr, String> {
    match (e, key) {
        (Expr::Root(map), Expr::Lit(Val::Str(domain))) => Ok(Expr::Domain(map, domain)),
        (Expr::Domain(map, domain), Expr::Lit(Val::Str(name))) => Ok(Expr::Lookup(map, domain, name)),
        _ => Err("index other than a string literal on device.attributes/capacity".into()),
    }
}

/// A value, or why there is none: [`Verdict::Error`] or [`Verdict::Unknown`].
type Eval = Result<Val, Verdict>;

fn no_overload(f: &str, a: &Val, b: &Val) -> Verdict {
    Verdict::Error(format!("no matching overload for '{f}' applied to ({}, {})", a.type_name(), b.type_name()))
}

/// The commutative absorption of `&&`/`||`: a `decisive` operand decides; otherwise Unknown outranks
/// Error, which outranks the `neutral` result.
fn combine(verdicts: impl Iterator<Item = Verdict>, decisive: Verdict, neutral: Verdict) -> Verdict {
    let rank = |v: &Verdict| match v {
        Verdict::Unknown(_) => 2,
        Verdict::Error(_) => 1,
        _ => 0,
    };
    let mut worst = neutral;
    for v in verdicts {
        if v == decisive {
            return v;
        }
        if rank(&v) > rank(&worst) {
            worst = v;
        }
    }
    worst
}

fn verdict(e: &Expr, d: &DeviceInput<'_>) -> Verdict {
    match e {
        Expr::Not(x) => match verdict(x, d) {
            Verdict::Match => Verdict::NoMatch,
            Verdict::NoMatch => Verdict::Match,
            other => other,
        },
        Expr::And(parts) => combine(parts.iter().map(|(e, _)| verdict(e, d)), Verdict::NoMatch, Verdict::Match),
        Expr::Or(parts) => combine(parts.iter().map(|e| verdict(e, d)), Verdict::Match, Verdict::NoMatch),
        _ => match value(e, d) {
            Ok(Val::Bool(true)) => Verdict::Match,
            Ok(Val::Bool(false)) => Verdict::NoMatch,
            Ok(v) => Verdict::Error(format!("result of type {} is not a bool", v.type_name())),
            Err(v) => v,
        },
    }
}

/// The key a lookup reads: bare names are the driver's domain, which may also be spelled out.
fn find<'m, T>(m: &'m BTreeMap<String, T>, d: &DeviceInput<'_>, domain: &str, name: &str) -> Option<&'m T> {
    let bare = (domain == d.driver).then(|| m.get(name)).flatten();
    bare.or_else(|| m.get(&format!("{domain}/{name}")))
}

fn quantity(s: &str, what: &str) -> Eval {
    let q: Quantity =
        s.parse().map_err(|_| Verdict::Unknown(format!("{what} {s:?}: a form this evaluator does not compare")))?;
    Ok(Val::Quantity(q.base()))
}

fn value(e: &Expr, d: &DeviceInput<'_>) -> Eval {
    let no_key = |name: &str| Verdict::Error(format!("no such key: {name}"));
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::List(items) => items.iter().map(|e| value(e, d)).collect::<Result<_, _>>().map(Val::List),
        Expr::Driver => Ok(Val::Str(d.driver.to_string())),
        Expr::Device | Expr::Root(_) | Expr::Domain(..) => Err(Verdict::Unknown("a whole map as a value".into())),
        Expr::Lookup(Map::Attributes, domain, name) => {
            let a = find(d.attributes, d, domain, name).ok_or_else(|| no_key(name))?;
            match a {
                Attribute::Bool(b) => Ok(Val::Bool(*b)),
                Attribute::Int(i) => Ok(Val::Int(*i)),
                Attribute::String(s) => Ok(Val::Str(s.clone())),
                Attribute::Version(_) => Ok(Val::Version),
                Attribute::Other => Err(Verdict::Unknown(format!("list-valued attribute {name}"))),
            }
        }
        Expr::Lookup(Map::Capacity, domain, name) => {
            let c = find(d.capacity, d, domain, name).ok_or_else(|| no_key(name))?;
            quantity(&c.value, &format!("capacity {name}"))
        }
        Expr::Has(map, domain, name) => Ok(Val::Bool(match map {
            Map::Attributes => find(d.attributes, d, domain, name).is_some(),
            Map::Capacity => find(d.capacity, d, domain, name).is_some(),
        })),
        Expr::Quantity(s) => quantity(s, "quantity"),
        Expr::Not(_) | Expr::And(_) | Expr::Or(_) => match verdict(e, d) {
            Verdict::Match => Ok(Val::Bool(true)),
            Verdict::NoMatch => Ok(Val::Bool(false)),
            v => Err(v),
        },
        Expr::Cmp(op, a, b) => {
            // An attribute is `dyn`: `==` across types is false at run time, not a compile error.
            let dynamic = [a, b].iter().any(|x| matches!(***x, Expr::Lookup(Map::Attributes, ..)));
            compare(op, &value(a, d)?, &value(b, d)?, dynamic)
        }
        Expr::In(a, b) => match (value(a, d)?, value(b, d)?) {
            (needle, Val::List(items)) => {
                for item in &items {
                    if compare("==", &needle, item, true)? == Val::Bool(true) {
                        return Ok(Val::Bool(true));
                    }
                }
                Ok(Val::Bool(false))
            }
            (needle, other) => Err(no_overload("@in", &needle, &other)),
        },
        Expr::Method(method, a, b) => match (*method, value(a, d)?, value(b, d)?) {
            ("compareTo", Val::Quantity(x), Val::Quantity(y)) => Ok(Val::Int(x.cmp(&y) as i64)),
            ("isGreaterThan", Val::Quantity(x), Val::Quantity(y)) => Ok(Val::Bool(x > y)),
            ("isLessThan", Val::Quantity(x), Val::Quantity(y)) => Ok(Val::Bool(x < y)),
            ("contains", Val::Str(x), Val::Str(y)) => Ok(Val::Bool(x.contains(y.as_str()))),
            ("startsWith", Val::Str(x), Val::Str(y)) => Ok(Val::Bool(x.starts_with(y.as_str()))),
            ("endsWith", Val::Str(x), Val::Str(y)) => Ok(Val::Bool(x.ends_with(y.as_str()))),
            (_, x, y) => Err(no_overload(method, &x, &y)),
        },
    }
}

fn compare(op: &str, a: &Val, b: &Val, dynamic: bool) -> Eval {
    match (a, b) {
        (Val::Version, _) | (_, Val::Version) => {
            return Err(Verdict::Unknown("comparison of a version attribute".into()));
        }
        (Val::List(_), Val::List(_)) => return Err(Verdict::Unknown("comparison of two lists".into())),
        _ => {}
    }
    let order = match (a, b) {
        (Val::Bool(x), Val::Bool(y)) => Some(x.cmp(y)),
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        // Quantities have ==, and compare otherwise only through their methods.
        (Val::Quantity(x), Val::Quantity(y)) if matches!(op, "==" | "!=") => Some(x.cmp(y)),
        _ => None,
    };
    let holds = match (op, order) {
        ("==", Some(o)) => o.is_eq(),
        ("!=", Some(o)) => o.is_ne(),
        ("<", Some(o)) => o.is_lt(),
        ("<=", Some(o)) => o.is_le(),
        (">", Some(o)) => o.is_gt(),
        (_, Some(o)) => o.is_ge(),
        ("==" | "!=", None) if dynamic => op == "!=",
        (_, None) => return Err(no_overload(&format!("_{op}_"), a, b)),
    };
    Ok(Val::Bool(holds))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIG: &str = "mig.slinky.slurm.net";

    struct Dev {
        driver: &'static str,
        attributes: BTreeMap<String, Attribute>,
        capacity: BTreeMap<String, Amount>,
    }

    impl Dev {
        fn eval(&self, expr: &str) -> Verdict {
            self.check(&Selector::parse(expr))
        }
        fn check(&self, sel: &Selector) -> Verdict {
            sel.eval(&DeviceInput { driver: self.driver, attributes: &self.attributes, capacity: &self.capacity })
        }
        fn with(mut self, key: &str, a: Attribute) -> Self {
            self.attributes.insert(key.into(), a);
            self
        }
    }

    fn s(v: &str) -> Attribute {
        Attribute::String(v.into())
    }
    fn i(v: i64) -> Attribute {
        Attribute::Int(v)
    }

    /// A migdra MIG device as its ResourceSlice publishes it.
    fn mig(profile: &str, gpu: i64, memory: &str) -> Dev {
        let attributes = [
            ("type", s("mig")),
            ("profile", s(profile)),
            ("profileId", i(9)),
            ("slurmGpuIndex", i(gpu)),
            ("placementStart", i(4)),
            ("resource.kubernetes.io/pciBusID", s("0000:3b:00.0")),
        ];
        let capacity = [("memory", memory), ("multiprocessors", "60")];
        Dev {
            driver: MIG,
            attributes: attributes.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            capacity: capacity.into_iter().map(|(k, v)| (k.into(), Amount { value: v.into() })).collect(),
        }
    }

    fn nvidia(name: &str) -> Dev {
        let attributes = [("name".to_string(), s(name))].into();
        Dev { driver: "gpu.nvidia.com", attributes, capacity: BTreeMap::new() }
    }

    use Verdict::{Match, NoMatch};

    fn err(v: Verdict) -> String {
        match v {
            Verdict::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }
    fn unknown(v: Verdict) -> String {
        match v {
            Verdict::Unknown(e) => e,
            other => panic!("expected unknown, got {other:?}"),
        }
    }

    #[test]
    fn selectors_in_use() {
        let (m3, m1) = (mig("3g.40gb", 1, "40192Mi"), mig("1g.10gb+me", 3, "9856Mi"));
        let profile = concat!(
            r#"device.driver == "mig.slinky.slurm.net" && "#,
            r#"device.attributes["mig.slinky.slurm.net"].type == "mig" && "#,
            r#"device.attributes["mig.slinky.slurm.net"].profile == "1g.10gb+me""#
        );
        assert_eq!((m1.eval(profile), m3.eval(profile)), (Match, NoMatch));
        let pin = r#"device.attributes["mig.slinky.slurm.net"].slurmGpuIndex == 3"#;
        assert_eq!((m1.eval(pin), m3.eval(pin)), (Match, NoMatch));
        let listed = "device.attributes['gpu.nvidia.com'].name in ['gpu-0','gpu-1']";
        assert_eq!((nvidia("gpu-1").eval(listed), nvidia("gpu-2").eval(listed)), (Match, NoMatch));
        let index = r#"device.attributes["mig.slinky.slurm.net"]["profile"] == "3g.40gb""#;
        assert_eq!((m3.eval(index), m1.eval(index)), (Match, NoMatch));
        let bus = r#"device.attributes["resource.kubernetes.io"].pciBusID == "0000:3b:00.0""#;
        assert_eq!(
            (m3.eval(bus), nvidia("x").eval(&bus.replace("==", "!="))),
            (Match, Verdict::Error("no such key: pciBusID".into()))
        );
    }

    /// The string tests, as the `notebook-1g` claim template writes one: no extras.
    #[test]
    fn strings() {
        let (plain, extra) = (mig("1g.10gb", 1, "9856Mi"), mig("1g.10gb+me", 1, "9856Mi"));
        let d = r#"device.attributes["mig.slinky.slurm.net"]"#;
        let no_extras = format!(r#"!{d}.profile.contains("+")"#);
        assert_eq!((plain.eval(&no_extras), extra.eval(&no_extras)), (Match, NoMatch));
        let starts = format!(r#"{d}.profile.startsWith("1g.")"#);
        assert_eq!((plain.eval(&starts), mig("3g.40gb", 1, "1").eval(&starts)), (Match, NoMatch));
        let ends = format!(r#"{d}.profile.endsWith("+me")"#);
        assert_eq!((extra.eval(&ends), plain.eval(&ends)), (Match, NoMatch));
        // An int has no .contains(): an error, as cel-go reports it.
        assert!(err(plain.eval(&format!(r#"{d}.slurmGpuIndex.contains("1")"#))).contains("contains"));
    }

    #[test]
    fn quantities() {
        let (m3, m1, full) = (mig("3g.40gb", 1, "40192Mi"), mig("1g.10gb", 1, "9856Mi"), mig("7g.80gb", 1, "81152Mi"));
        // 3g.40gb has 40192Mi, less than 40Gi.
        let at_least = r#"device.capacity["mig.slinky.slurm.net"].memory.compareTo(quantity("40Gi")) >= 0"#;
        assert_eq!((full.eval(at_least), m3.eval(at_least)), (Match, NoMatch));
        let above = r#"device.capacity["mig.slinky.slurm.net"].memory.isGreaterThan(quantity("10Gi"))"#;
        assert_eq!((m3.eval(above), m1.eval(above)), (Match, NoMatch));
        let below = r#"device.capacity["mig.slinky.slurm.net"].memory.isLessThan(quantity("20Gi"))"#;
        assert!(err(m1.eval(&below.replace("isLessThan", "contains"))).contains("contains"), "no quantity overload");
        assert_eq!((m1.eval(below), m3.eval(below)), (Match, NoMatch));
        let sms = r#"device.capacity["mig.slinky.slurm.net"].multiprocessors == quantity("60")"#;
        assert_eq!((m3.eval(sms), m3.eval(&sms.replace("60", "61"))), (Match, NoMatch));
        assert!(unknown(m3.eval(&sms.replace("60", "6e1"))).contains("6e1"));
        assert!(unknown(m3.eval(&above.replace("10Gi", "500m"))).contains("500m"));
        assert!(unknown(mig("x", 1, "1.5").eval(above)).contains("capacity memory"));
        assert_eq!(
            m3.eval(r#"device.capacity["mig.slinky.slurm.net"].nvlinks.isLessThan(quantity("1"))"#),
            Verdict::Error("no such key: nvlinks".into())
        );
        assert!(err(m3.eval(r#"device.capacity["mig.slinky.slurm.net"].memory < quantity("1")"#)).contains("'_<_'"));
    }

    #[test]
    fn presence_is_never_an_error() {
        let (plain, with) =
            (mig("3g.40gb", 1, "40192Mi"), mig("3g.40gb", 1, "40192Mi").with("mig.slinky.slurm.net/uuid", s("MIG-1")));
        for e in [
            r#""uuid" in device.attributes["mig.slinky.slurm.net"]"#,
            r#"has(device.attributes["mig.slinky.slurm.net"].uuid)"#,
        ] {
            assert_eq!((with.eval(e), plain.eval(e)), (Match, NoMatch), "{e}");
            assert_eq!(plain.eval(&e.replace("mig.slinky.slurm.net", "other.example.com")), NoMatch);
        }
        assert_eq!(with.eval(r#"device.attributes["mig.slinky.slurm.net"].uuid == "MIG-1""#), Match);
        // has() takes a field selection only.
        assert!(unknown(with.eval(r#"has(device.attributes["mig.slinky.slurm.net"]["uuid"])"#)).contains("has()"));
    }

    #[test]
    fn operators() {
        let m = mig("3g.40gb", 1, "40192Mi");
        let a = |n: &str| format!(r#"device.attributes["mig.slinky.slurm.net"].{n}"#);
        let cases = [
            (format!("!({} == 1)", a("slurmGpuIndex")), NoMatch),
            (format!("{} == 2 || {} == 1", a("slurmGpuIndex"), a("slurmGpuIndex")), Match),
            (format!("{} != 9", a("profileId")), NoMatch),
            (
                format!("{p} < 5 && {p} <= 4 && {p} > 3 && {p} >= 4 && {p} > -1 && -3 < 0", p = a("placementStart")),
                Match,
            ),
            (format!("{p} < '4g' && {p} >= \"3g.40gb\" && {p} > 'z'", p = a("profile")), NoMatch),
            (format!("({} < '4g' || false) && ({} == 'mig') == true", a("profile"), a("type")), Match),
            ("true != false && !false".into(), Match),
            (r#""a\\b\"c\'d\n" == 'a\\b"c\'d\n' && "\t" != "t""#.into(), Match),
            ("device.driver in [\"gpu.nvidia.com\", 'mig.slinky.slurm.net']".into(), Match),
        ];
        for (expr, want) in cases {
            assert_eq!(m.eval(&expr), want, "{expr}");
        }
    }

    #[test]
    fn errors() {
        let m = mig("3g.40gb", 1, "40192Mi");
        let mut bare = mig("3g.40gb", 1, "40192Mi");
        bare.attributes.remove("slurmGpuIndex");
        let pin = r#"device.attributes["mig.slinky.slurm.net"].slurmGpuIndex == 1"#;
        assert_eq!(bare.eval(pin), Verdict::Error("no such key: slurmGpuIndex".into()));
        assert_eq!(m.eval(&pin.replace("mig.slinky", "other")), Verdict::Error("no such key: slurmGpuIndex".into()));
        assert_eq!(
            m.eval(&pin.replace("== 1", r#"< "3""#)),
            Verdict::Error("no matching overload for '_<_' applied to (int, string)".into())
        );
        // An attribute is dyn: == across types is false (cel-go's heterogeneous equality)...
        assert_eq!(
            (m.eval(&pin.replace("== 1", r#"== "1""#)), m.eval(&pin.replace("== 1", "!= '1'"))),
            (NoMatch, Match)
        );
        // ...but statically typed operands that differ do not compile.
        assert!(err(m.eval("device.driver == 3")).contains("(string, int)"));
        assert!(err(m.eval(r#"device.attributes["mig.slinky.slurm.net"].profile"#)).contains("string is not a bool"));
        assert!(err(m.eval("device.driver")).contains("not a bool"));
        assert!(err(m.eval("!device.attributes['mig.slinky.slurm.net'].profileId")).contains("int"));
    }

    #[test]
    fn unknown_constructs_are_named() {
        let m = mig("3g.40gb", 1, "40192Mi").with("driverVersion", Attribute::Version("1.2.3".into()));
        let d = r#"device.attributes["mig.slinky.slurm.net"]"#;
        let cases = [
            (format!(r#"{d}.profile.matches("^3g")"#), "method .matches()"),
            (format!(r#"{d}.driverVersion == semver("1.2.3")"#), "function semver()"),
            (format!(r#"{d}.driverVersion == "1.2.3""#), "version"),
            ("device.driver == 'x' ? true : false".into(), "ternary"),
            (format!("{d}.slurmGpuIndex + 1 == 2"), "arithmetic '+'"),
            (format!("-{d}.slurmGpuIndex == -1"), "negation"),
            (format!("{d}.profileId == 9.0"), "number literal 9.0"),
            ("device.attributes.exists(k, true)".into(), "method .exists()"),
            (format!(r"{d}.profile == 'a\x41b'"), "string escape \\x"),
            (format!("{d}.profile == 'open"), "unterminated"),
            (format!("{d}.profile =="), "end of expression"),
            ("device == device".into(), "as a value"),
            ("[1] == [1]".into(), "two lists"),
        ];
        for (expr, reason) in cases {
            let got = unknown(m.eval(&expr));
            assert!(got.contains(reason), "{expr}: {got}");
        }
    }

    #[test]
    fn absorption() {
        let m = mig("3g.40gb", 1, "40192Mi");
        let missing = r#"device.attributes["mig.slinky.slurm.net"].nope == 1"#;
        let unsupported = r#"device.capacity["mig.slinky.slurm.net"].memory.isLessThan(quantity("1.5"))"#;
        let e = || Verdict::Error("no such key: nope".into());
        let u = unknown(m.eval(unsupported));
        let cases = [
            (format!("false && {missing}"), NoMatch),
            (format!("{missing} && false"), NoMatch),
            (format!("true && {missing}"), e()),
            (format!("true || {missing}"), Match),
            (format!("{missing} || true"), Match),
            (format!("false || {missing}"), e()),
            (format!("!({missing})"), e()),
            (format!("{unsupported} && false"), NoMatch),
            (format!("{unsupported} || true"), Match),
            (format!("{unsupported} && {missing}"), Verdict::Unknown(u.clone())),
            (format!("{missing} || {unsupported}"), Verdict::Unknown(u.clone())),
            (format!("({missing}) == false"), e()),
        ];
        for (expr, want) in cases {
            assert_eq!(m.eval(&expr), want, "{expr}");
        }
    }

    #[test]
    fn without_attribute_and_pinned() {
        let d = r#"device.attributes["mig.slinky.slurm.net"]"#;
        let sel = Selector::parse(&format!(
            r#"device.driver == "{MIG}" && {d}.profile == "3g.40gb" && 3 == {d}.slurmGpuIndex"#
        ));
        assert_eq!(sel.pinned("profile").as_deref(), Some("3g.40gb"));
        assert_eq!(sel.pinned("slurmGpuIndex").as_deref(), Some("3"));
        assert_eq!(sel.pinned("type"), None);
        // A list of one is the same pin; of two, no single GPU.
        let listed = |list: &str| Selector::parse(&format!("{d}.slurmGpuIndex in {list}")).pinned("slurmGpuIndex");
        assert_eq!(listed("[3]").as_deref(), Some("3"));
        assert_eq!(listed("[3, 4]"), None);
        let free = sel.without_attribute("slurmGpuIndex").unwrap();
        assert_eq!(free.expression(), format!(r#"device.driver == "{MIG}" && {d}.profile == "3g.40gb""#));
        let gpu1 = mig("3g.40gb", 1, "40192Mi");
        assert_eq!((gpu1.check(&free), gpu1.check(&sel)), (Match, NoMatch));
        assert_eq!(free.pinned("slurmGpuIndex"), None);
        assert_eq!(sel.without_attribute("type").unwrap().expression(), sel.expression());
        let only = Selector::parse(&format!("{d}.slurmGpuIndex == 3"));
        assert!(only.without_attribute("slurmGpuIndex").is_none());
        let grouped = Selector::parse(&format!("({d}.slurmGpuIndex == 3 && {d}.type == 'mig')"));
        assert_eq!(grouped.without_attribute("slurmGpuIndex").unwrap().expression(), format!("{d}.type == 'mig'"));
        // Inside ||, a pin is not top-level.
        let either = Selector::parse(&format!("{d}.slurmGpuIndex == 3 || {d}.slurmGpuIndex == 1"));
        assert_eq!(either.pinned("slurmGpuIndex"), None);
        assert!(Selector::parse("semver('1.0.0')").without_attribute("x").is_none());
    }
}
