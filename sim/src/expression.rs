//! DynamoDB's condition and update expressions, evaluated on items in DynamoDB's JSON
//! (`{"S": ...}`, `{"N": ...}`, `{"M": {...}}`), for the wire doubles of the simulation.
//!
//! Only what the adapter writes is understood: conditions made of `attribute_exists`,
//! `attribute_not_exists`, comparisons (`=`, `<>`, `<`, `<=`, `>`, `>=`) of attributes,
//! nested attributes (`#a.#b`), `size(...)` and values, joined by `AND`, `OR`, `NOT` and
//! parentheses; updates of `SET` (a value, an attribute, `if_not_exists(...)`, a sum or a
//! difference of two of them) and `REMOVE`. Anything else is an error, which the double
//! reports as a failure of the schedule: it never accepts what it cannot evaluate.

use serde_json::{json, Map, Value};

/// An item: attribute names to values in DynamoDB's JSON.
pub(super) type Item = Map<String, Value>;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Punct(&'static str),
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut at = 0;
    let word_char = |c: char| c.is_alphanumeric() || c == '_' || c == '#' || c == ':';
    while at < chars.len() {
        let c = chars[at];
        if c.is_whitespace() {
            at += 1;
            continue;
        }
        let next = chars.get(at + 1).copied();
        let two = match (c, next) {
            ('<', Some('=')) => Some("<="),
            ('>', Some('=')) => Some(">="),
            ('<', Some('>')) => Some("<>"),
            _ => None,
        };
        if let Some(two) = two {
            out.push(Token::Punct(two));
            at += 2;
            continue;
        }
        let one = match c {
            '(' => Some("("),
            ')' => Some(")"),
            ',' => Some(","),
            '.' => Some("."),
            '=' => Some("="),
            '<' => Some("<"),
            '>' => Some(">"),
            '+' => Some("+"),
            '-' => Some("-"),
            _ => None,
        };
        if let Some(one) = one {
            out.push(Token::Punct(one));
            at += 1;
            continue;
        }
        if word_char(c) {
            let start = at;
            while at < chars.len() && word_char(chars[at]) {
                at += 1;
            }
            out.push(Token::Word(chars[start..at].iter().collect()));
            continue;
        }
        return Err(format!("unexpected {c:?} in {text:?}"));
    }
    Ok(out)
}

/// An expression with its names and values (`ExpressionAttributeNames`,
/// `ExpressionAttributeValues`, as the request carried them).
pub(super) struct Expression<'a> {
    text: &'a str,
    tokens: Vec<Token>,
    at: usize,
    names: &'a Value,
    values: &'a Value,
}

impl<'a> Expression<'a> {
    pub(super) fn new(text: &'a str, names: &'a Value, values: &'a Value) -> Result<Self, String> {
        Ok(Self {
            text,
            tokens: tokens(text)?,
            at: 0,
            names,
            values,
        })
    }

    fn error(&self, what: &str) -> String {
        format!("{what} at token {} of {:?}", self.at, self.text)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat_word(&mut self, word: &str) -> bool {
        if matches!(self.peek(), Some(Token::Word(w)) if w == word) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn eat_punct(&mut self, punct: &str) -> bool {
        if matches!(self.peek(), Some(Token::Punct(p)) if *p == punct) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, punct: &str) -> Result<(), String> {
        if self.eat_punct(punct) {
            Ok(())
        } else {
            Err(self.error(&format!("expected {punct:?}")))
        }
    }

    fn done(&self) -> bool {
        self.at == self.tokens.len()
    }

    /// A document path: its attribute names, placeholders resolved.
    fn path(&mut self) -> Result<Vec<String>, String> {
        let mut path = Vec::new();
        loop {
            let Some(Token::Word(word)) = self.peek().cloned() else {
                return Err(self.error("expected an attribute"));
            };
            if word.starts_with(':') || ["AND", "OR", "NOT", "SET", "REMOVE"].contains(&word.as_str()) {
                return Err(self.error("expected an attribute"));
            }
            self.at += 1;
            let name = if word.starts_with('#') {
                self.names[&word]
                    .as_str()
                    .ok_or_else(|| self.error(&format!("{word} is not in ExpressionAttributeNames")))?
                    .to_owned()
            } else {
                word
            };
            path.push(name);
            if !self.eat_punct(".") {
                return Ok(path);
            }
        }
    }

    fn value(&mut self) -> Result<Option<Value>, String> {
        match self.peek().cloned() {
            Some(Token::Word(word)) if word.starts_with(':') => {
                self.at += 1;
                match self.values.get(&word) {
                    Some(value) => Ok(Some(value.clone())),
                    None => Err(self.error(&format!("{word} is not in ExpressionAttributeValues"))),
                }
            }
            _ => Ok(None),
        }
    }

    /// Evaluates the whole expression as a condition on `item` (`None`: no item).
    pub(super) fn condition(mut self, item: Option<&Item>) -> Result<bool, String> {
        let holds = self.or(item)?;
        if !self.done() {
            return Err(self.error("unexpected trailing tokens"));
        }
        Ok(holds)
    }

    fn or(&mut self, item: Option<&Item>) -> Result<bool, String> {
        let mut holds = self.and(item)?;
        while self.eat_word("OR") {
            let right = self.and(item)?;
            holds = holds || right;
        }
        Ok(holds)
    }

    fn and(&mut self, item: Option<&Item>) -> Result<bool, String> {
        let mut holds = self.unary(item)?;
        while self.eat_word("AND") {
            let right = self.unary(item)?;
            holds = holds && right;
        }
        Ok(holds)
    }

    fn unary(&mut self, item: Option<&Item>) -> Result<bool, String> {
        if self.eat_word("NOT") {
            return Ok(!self.unary(item)?);
        }
        if self.eat_punct("(") {
            let holds = self.or(item)?;
            self.expect_punct(")")?;
            return Ok(holds);
        }
        for (function, exists) in [("attribute_exists", true), ("attribute_not_exists", false)] {
            if self.eat_word(function) {
                self.expect_punct("(")?;
                let path = self.path()?;
                self.expect_punct(")")?;
                return Ok(lookup(item, &path).is_some() == exists);
            }
        }
        let left = self.operand(item)?;
        let op = match self.peek() {
            Some(Token::Punct(op)) if ["=", "<>", "<", "<=", ">", ">="].contains(op) => *op,
            _ => return Err(self.error("expected a comparison")),
        };
        self.at += 1;
        let right = self.operand(item)?;
        Ok(compare(left.as_ref(), op, right.as_ref()))
    }

    fn operand(&mut self, item: Option<&Item>) -> Result<Option<Value>, String> {
        if self.eat_word("size") {
            self.expect_punct("(")?;
            let path = self.path()?;
            self.expect_punct(")")?;
            return Ok(lookup(item, &path).map(|value| json!({ "N": size(value).to_string() })));
        }
        if let Some(value) = self.value()? {
            return Ok(Some(value));
        }
        let path = self.path()?;
        Ok(lookup(item, &path).cloned())
    }

    /// Applies the whole expression as an update to `item` (a new item: only its key).
    pub(super) fn update(mut self, item: &mut Item) -> Result<(), String> {
        let old = item.clone();
        while !self.done() {
            if self.eat_word("SET") {
                loop {
                    let path = self.path()?;
                    self.expect_punct("=")?;
                    let value = self.value_expression(&old)?;
                    set(item, &path, value).map_err(|error| self.error(&error))?;
                    if !self.eat_punct(",") {
                        break;
                    }
                }
            } else if self.eat_word("REMOVE") {
                loop {
                    let path = self.path()?;
                    remove(item, &path);
                    if !self.eat_punct(",") {
                        break;
                    }
                }
            } else {
                return Err(self.error("expected SET or REMOVE"));
            }
        }
        Ok(())
    }

    fn value_expression(&mut self, old: &Item) -> Result<Value, String> {
        let first = self.value_operand(old)?;
        for (punct, sign) in [("+", 1), ("-", -1)] {
            if self.eat_punct(punct) {
                let second = self.value_operand(old)?;
                let (Some(a), Some(b)) = (number(&first), number(&second)) else {
                    return Err(self.error("arithmetic on something other than two numbers"));
                };
                return Ok(json!({ "N": (a + sign * b).to_string() }));
            }
        }
        Ok(first)
    }

    fn value_operand(&mut self, old: &Item) -> Result<Value, String> {
        if self.eat_word("if_not_exists") {
            self.expect_punct("(")?;
            let path = self.path()?;
            self.expect_punct(",")?;
            let default = self.value_expression(old)?;
            self.expect_punct(")")?;
            return Ok(lookup(Some(old), &path).cloned().unwrap_or(default));
        }
        if let Some(value) = self.value()? {
            return Ok(value);
        }
        let path = self.path()?;
        lookup(Some(old), &path)
            .cloned()
            .ok_or_else(|| self.error("the expression refers to an attribute that does not exist in the item"))
    }
}

/// The value at `path` in `item`.
pub(super) fn lookup<'v>(item: Option<&'v Item>, path: &[String]) -> Option<&'v Value> {
    let (first, rest) = path.split_first()?;
    let mut value = item?.get(first)?;
    for name in rest {
        value = value.get("M")?.get(name)?;
    }
    Some(value)
}

fn set(item: &mut Item, path: &[String], value: Value) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("a path has a name");
    let mut map = item;
    for name in parents {
        map = map
            .get_mut(name)
            .and_then(|parent| parent.get_mut("M"))
            .and_then(Value::as_object_mut)
            .ok_or_else(|| "the document path provided in the update expression is invalid for update".to_owned())?;
    }
    map.insert(last.clone(), value);
    Ok(())
}

fn remove(item: &mut Item, path: &[String]) {
    let (last, parents) = path.split_last().expect("a path has a name");
    let mut map = item;
    for name in parents {
        match map
            .get_mut(name)
            .and_then(|parent| parent.get_mut("M"))
            .and_then(Value::as_object_mut)
        {
            Some(parent) => map = parent,
            None => return,
        }
    }
    map.remove(last);
}

fn number(value: &Value) -> Option<i128> {
    value.get("N")?.as_str()?.parse().ok()
}

fn size(value: &Value) -> usize {
    if let Some(map) = value.get("M").and_then(Value::as_object) {
        map.len()
    } else if let Some(list) = value.get("L").and_then(Value::as_array) {
        list.len()
    } else if let Some(text) = value.get("S").and_then(Value::as_str) {
        text.len()
    } else {
        0
    }
}

/// A comparison; one with a missing side is false, as DynamoDB has it.
fn compare(left: Option<&Value>, op: &str, right: Option<&Value>) -> bool {
    let (Some(left), Some(right)) = (left, right) else {
        return false;
    };
    let ordering = match (number(left), number(right)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => match (
            left.get("S").and_then(Value::as_str),
            right.get("S").and_then(Value::as_str),
        ) {
            (Some(a), Some(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
            _ => None,
        },
    };
    let Some(ordering) = ordering else {
        return match op {
            "=" => left == right,
            "<>" => left != right,
            _ => false,
        };
    };
    match op {
        "=" => ordering.is_eq(),
        "<>" => !ordering.is_eq(),
        "<" => ordering.is_lt(),
        "<=" => ordering.is_le(),
        ">" => ordering.is_gt(),
        _ => ordering.is_ge(),
    }
}

/// An item's size as DynamoDB counts it, near enough: names and values.
pub(super) fn item_bytes(item: &Item) -> usize {
    item.iter().map(|(name, value)| name.len() + value_bytes(value)).sum()
}

fn value_bytes(value: &Value) -> usize {
    let Some((kind, inner)) = value.as_object().and_then(|typed| typed.iter().next()) else {
        return 0;
    };
    match kind.as_str() {
        "S" | "N" | "B" => inner.as_str().map_or(0, str::len),
        "M" => {
            3 + inner.as_object().map_or(0, |map| {
                map.iter()
                    .map(|(name, value)| 1 + name.len() + value_bytes(value))
                    .sum()
            })
        }
        "L" => {
            3 + inner
                .as_array()
                .map_or(0, |list| list.iter().map(|value| 1 + value_bytes(value)).sum())
        }
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(value: Value) -> Item {
        value.as_object().expect("an object").clone()
    }

    #[test]
    fn conditions_and_updates_are_evaluated() {
        let names =
            json!({ "#data": "data", "#fence": "outbox_fence", "#outbox": "outbox", "#txn": "t1", "#pk": "pk" });
        let values =
            json!({ ":expected": { "N": "1" }, ":txnid": { "S": "b" }, ":one": { "N": "1" }, ":zero": { "N": "0" } });
        let k = item(
            json!({ "pk": { "S": "K" }, "data": { "M": {} }, "version": { "N": "1" }, "outbox_fence": { "S": "a" } }),
        );
        let holds =
            |text: &str, item: Option<&Item>| Expression::new(text, &names, &values).unwrap().condition(item).unwrap();
        assert!(holds("attribute_exists(#data) AND version = :expected", Some(&k)));
        assert!(!holds("attribute_not_exists(#pk)", Some(&k)));
        assert!(holds("attribute_not_exists(#pk)", None));
        assert!(holds(
            "attribute_exists(#data) AND attribute_not_exists(#outbox.#txn) AND (attribute_not_exists(#fence) OR #fence < :txnid)",
            Some(&k)
        ));
        assert!(!holds("#fence >= :txnid", Some(&k)));
        assert!(Expression::new("begins_with(#data, :one)", &names, &values)
            .unwrap()
            .condition(Some(&k))
            .is_err());
        let mut updated = k.clone();
        Expression::new(
            "SET #data = :one, version = if_not_exists(version, :zero) + :one, #fence = :txnid REMOVE #outbox",
            &names,
            &values,
        )
        .unwrap()
        .update(&mut updated)
        .unwrap();
        assert_eq!(updated["version"], json!({ "N": "2" }));
        assert_eq!(updated["outbox_fence"], json!({ "S": "b" }));
    }
}
