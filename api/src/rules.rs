//! The input rules, each written once. The handlers and extractors check them, and the
//! OpenAPI document states them through the schema types below (`pattern`, `minLength`,
//! `minimum`, `format`...), so that what the document promises and what the code accepts
//! cannot drift apart: a client (or a fuzzer) that sends what the document allows is
//! accepted, and what it forbids is refused.
//!
//! Patterns are checked with `regex-lite`. The patterns here use only anchors, character
//! classes, groups, alternation and bounded repetition, which mean the same in it as in
//! ECMA-262, the dialect of JSON Schema's `pattern`.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

use regex_lite::Regex;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, PartialSchema, ToSchema};

/// A rule for a string: its length in characters and a pattern it matches whole.
#[derive(Debug)]
pub struct Text {
    length: RangeInclusive<usize>,
    pattern: &'static str,
    regex: OnceLock<Regex>,
}

impl Text {
    const fn new(length: RangeInclusive<usize>, pattern: &'static str) -> Self {
        Self {
            length,
            pattern,
            regex: OnceLock::new(),
        }
    }

    /// Whether `text` follows the rule.
    pub fn allows(&self, text: &str) -> bool {
        self.length.contains(&text.chars().count())
            && self
                .regex
                .get_or_init(|| Regex::new(self.pattern).expect("the rules' patterns are valid"))
                .is_match(text)
    }

    /// The pattern, as the document states it.
    pub fn pattern(&self) -> &'static str {
        self.pattern
    }

    /// The lengths allowed, in characters.
    pub fn length(&self) -> RangeInclusive<usize> {
        self.length.clone()
    }

    fn schema(&self) -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(*self.length.start()))
            .max_length(Some(*self.length.end()))
            .pattern(Some(self.pattern))
    }
}

/// An order id: a UUID, in its hyphenated form only (one spelling per id).
pub static ORDER_ID: Text = Text::new(
    36..=36,
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
);

/// A transaction id: a UUID v7 (the version digit is 7), hyphenated, as
/// `outbox::protocol::TxnId` parses it.
pub static TRANSACTION_ID: Text = Text::new(
    36..=36,
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-7[0-9a-fA-F]{3}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
);

/// The item of an order, as the `x-transaction-item` header names it and a status query
/// takes it back: `ORDER#` and the order's id.
pub static TRANSACTION_ITEM: Text = Text::new(
    42..=42,
    "^ORDER#[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
);

/// The `x-transaction-item` response header of an order's change: its item, percent-encoded
/// (`ORDER%23` and the order's id), as it goes into a status query's `item` unchanged.
pub static TRANSACTION_ITEM_HEADER: Text = Text::new(
    44..=44,
    "^ORDER%23[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
);

/// A customer id.
pub static CUSTOMER_ID: Text = Text::new(1..=64, "^[A-Za-z0-9_-]+$");

/// A stock keeping unit.
pub static SKU: Text = Text::new(1..=32, "^[A-Z0-9-]+$");

/// The `Idempotency-Key` header: a key of 1 to 255 printable ASCII characters, bare or as
/// a structured-field string (in double quotes, which are not part of the key). A bare
/// key neither starts nor ends with a space: HTTP would strip it.
pub static IDEMPOTENCY_KEY: Text = Text::new(1..=257, outbox::http::headers::IDEMPOTENCY_KEY_PATTERN);

/// The `If-Match` header: `*`, or one ETag, strong or weak. Versions have at most 19
/// digits, so that every one the header can name fits a `u64`.
pub static IF_MATCH: Text = Text::new(1..=23, outbox::http::headers::IF_MATCH_PATTERN);

/// How many of an item an order line may hold.
pub const QUANTITY: RangeInclusive<u32> = 1..=999;

/// The price of one unit, in cents.
pub const UNIT_PRICE_CENTS: RangeInclusive<u64> = 0..=10_000_000;

/// How many lines an order holds.
pub const LINE_ITEMS: RangeInclusive<usize> = 1..=50;

/// How many seconds `Retry-After` asks a client to wait.
pub const RETRY_AFTER_SECONDS: u32 = outbox::http::problem::RETRY_AFTER_SECONDS;

/// The rules' schemas, for the document: functions for fields
/// (`#[schema(schema_with = ...)]`), and types for parameters and headers of
/// `#[utoipa::path]` (`inline(...)`).
pub mod schema {
    use super::*;

    macro_rules! schema_type {
        ($(#[$doc:meta])* $name:ident => $schema:expr) => {
            $(#[$doc])*
            #[derive(Debug)]
            pub struct $name;

            impl PartialSchema for $name {
                fn schema() -> RefOr<Schema> {
                    $schema.into()
                }
            }

            impl ToSchema for $name {}
        };
    }

    fn uuid(rule: &Text) -> ObjectBuilder {
        rule.schema().format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
    }

    /// An order's id.
    pub fn order_id() -> ObjectBuilder {
        uuid(&ORDER_ID).description(Some("An order's id: a UUID"))
    }

    /// A transaction's id.
    pub fn transaction_id() -> ObjectBuilder {
        uuid(&TRANSACTION_ID).description(Some("A transaction's id: a UUID v7"))
    }

    /// The item a transaction in entity mode commits into.
    pub fn transaction_item() -> ObjectBuilder {
        TRANSACTION_ITEM.schema().description(Some(
            "The item a change of one order committed into, as its answer's `x-transaction-item` header names it: \
             `ORDER#` and the order's id",
        ))
    }

    /// A customer id.
    pub fn customer_id() -> ObjectBuilder {
        CUSTOMER_ID
            .schema()
            .description(Some("Who places the order: 1 to 64 characters from `A-Z a-z 0-9 - _`"))
            .examples(["c-1"])
    }

    /// A SKU.
    pub fn sku() -> ObjectBuilder {
        SKU.schema()
            .description(Some("Stock keeping unit: 1 to 32 characters from `A-Z 0-9 -`"))
            .examples(["SKU-1"])
    }

    /// A line's quantity.
    pub fn quantity() -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
            .minimum(Some(*QUANTITY.start()))
            .maximum(Some(*QUANTITY.end()))
            .description(Some("How many units"))
            .examples([2])
    }

    /// A unit price.
    pub fn unit_price_cents() -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(*UNIT_PRICE_CENTS.start()))
            .maximum(Some(*UNIT_PRICE_CENTS.end()))
            .description(Some("Price of one unit, in cents"))
            .examples([1299])
    }

    /// The `Idempotency-Key` request header.
    pub fn idempotency_key() -> ObjectBuilder {
        IDEMPOTENCY_KEY.schema().description(Some(
            "Makes retries of this request safe: a repeat gets the first answer again, with \
             `Idempotent-Replayed: true`; the same key on a different request is a 422. \
             1 to 255 printable ASCII characters, bare or in double quotes",
        ))
    }

    /// The `If-Match` request header.
    pub fn if_match() -> ObjectBuilder {
        IF_MATCH.schema().description(Some(
            "`*` or the order's ETag (`\"3\"`, or weak `W/\"3\"`): the change applies only to that version, else 412",
        ))
    }

    /// The header of a request that creates: `Idempotency-Key`.
    #[derive(Debug, IntoParams)]
    #[into_params(parameter_in = Header)]
    pub struct Idempotent {
        /// Makes retries safe.
        #[param(rename = "Idempotency-Key", schema_with = idempotency_key, required = false)]
        pub idempotency_key: Option<String>,
    }

    /// The headers of a request that changes an order: `If-Match` and `Idempotency-Key`.
    #[derive(Debug, IntoParams)]
    #[into_params(parameter_in = Header)]
    pub struct Preconditions {
        /// Applies the change only to this version.
        #[param(rename = "If-Match", schema_with = if_match, required = false)]
        pub if_match: Option<String>,
        /// Makes retries safe.
        #[param(rename = "Idempotency-Key", schema_with = idempotency_key, required = false)]
        pub idempotency_key: Option<String>,
    }

    schema_type!(
        /// An order id, as a path parameter.
        OrderId => order_id()
    );
    schema_type!(
        /// A transaction id, as a path parameter or a header.
        TransactionId => transaction_id()
    );
    schema_type!(
        /// The item a transaction in entity mode commits into, as a response header.
        TransactionItem => TRANSACTION_ITEM_HEADER.schema().description(Some(
            "The item this change committed into, percent-encoded: give it as the `item` of \
             `GET /transactions/{id}` to read the change's status",
        ))
    );
    schema_type!(
        /// The `Link` response header of an answer naming a transaction.
        StatusLink => ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^<[^>]+>; rel=\"status\"$"))
            .description(Some(
                "Where to read what became of the transaction this answer names: \
                 `</transactions/{id}>; rel=\"status\"`, with `?item=` and its `x-transaction-item` for a change of one order",
            ))
    );
    schema_type!(
        /// A SKU, as a path parameter.
        Sku => sku()
    );
    schema_type!(
        /// The `ETag` response header.
        ETag => ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^\"[0-9]+\"$"))
            .description(Some("The order's version, quoted"))
    );
    schema_type!(
        /// The `Location` response header.
        Location => ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("uri-reference".into())))
            .description(Some("The new order's path"))
    );
    schema_type!(
        /// The `Retry-After` response header.
        RetryAfter => ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(RETRY_AFTER_SECONDS))
            .maximum(Some(RETRY_AFTER_SECONDS))
            .description(Some("Seconds to wait before retrying"))
    );
    schema_type!(
        /// The `Idempotent-Replayed` response header.
        Replayed => ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["true"]))
            .description(Some("Present when the answer is the replay of an earlier request with the same Idempotency-Key"))
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_allow_what_they_say() {
        assert!(SKU.allows("SKU-1") && !SKU.allows("sku-1") && !SKU.allows("") && !SKU.allows(&"A".repeat(33)));
        assert!(SKU.allows(&"A".repeat(32)) && !SKU.allows("SKU-1\n"));
        assert!(CUSTOMER_ID.allows("c_1-X") && !CUSTOMER_ID.allows("c 1") && !CUSTOMER_ID.allows(&"c".repeat(65)));
        assert!(IF_MATCH.allows("*") && IF_MATCH.allows("\"3\"") && IF_MATCH.allows("W/\"3\""));
        assert!(
            !IF_MATCH.allows("3") && !IF_MATCH.allows("\"+3\"") && !IF_MATCH.allows(&format!("\"{}\"", "9".repeat(20)))
        );
        assert!(IDEMPOTENCY_KEY.allows("k") && IDEMPOTENCY_KEY.allows("a b") && IDEMPOTENCY_KEY.allows("\" k \""));
        assert!(!IDEMPOTENCY_KEY.allows(" k") && !IDEMPOTENCY_KEY.allows("k\t") && !IDEMPOTENCY_KEY.allows("é"));
        assert!(IDEMPOTENCY_KEY.allows(&"k".repeat(255)) && !IDEMPOTENCY_KEY.allows(&"k".repeat(256)));
        assert!(IDEMPOTENCY_KEY.allows(&format!("\"{}\"", "k".repeat(255))));
    }

    #[test]
    fn a_transaction_id_follows_the_rule_exactly_when_it_parses() {
        use outbox::protocol::TxnId;
        let v7 = TxnId::new_v7().to_string();
        let samples = [
            v7.clone(),
            v7.to_uppercase(),
            "0190a6b2-1c2d-4e5f-8a9b-0123456789ab".to_owned(),
            "0190a6b21c2d7e5f8a9b0123456789ab".to_owned(),
            format!("{{{v7}}}"),
            format!("urn:uuid:{v7}"),
            v7[..35].to_owned(),
            format!("{v7}0"),
            "0190a6b2-1c2d-7e5f-0a9b-0123456789ab".to_owned(),
            "0190a6b2-1c2d-7e5f-8a9b-0123456789ag".to_owned(),
        ];
        for sample in samples {
            assert_eq!(
                TRANSACTION_ID.allows(&sample),
                sample.parse::<TxnId>().is_ok(),
                "{sample}"
            );
        }
    }

    #[test]
    fn the_librarys_header_checks_accept_exactly_what_the_documented_patterns_do() {
        use outbox::http::headers::parse_idempotency_key;
        use outbox::http::IfMatch;
        let long = "k".repeat(255);
        let samples: Vec<String> = [
            "k",
            "a b",
            " k",
            "k ",
            "\"k\"",
            "\" k \"",
            "\"\"",
            "\"",
            "\"k",
            "k\"",
            "é",
            "k\t",
            "*",
            "**",
            "\"3\"",
            "W/\"3\"",
            "w/\"3\"",
            "\"+3\"",
            "\"-1\"",
            "3",
            "\"3\", \"4\"",
            "W/*",
            "\"0\"",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([
            long.clone(),
            format!("{long}k"),
            format!("\"{long}\""),
            format!("\"{long}k\""),
            format!("\"{}\"", "9".repeat(19)),
            format!("\"{}\"", "9".repeat(20)),
        ])
        .collect();
        for sample in &samples {
            assert_eq!(
                IDEMPOTENCY_KEY.allows(sample),
                parse_idempotency_key(sample.as_bytes()).is_some(),
                "Idempotency-Key {sample:?}"
            );
            assert_eq!(
                IF_MATCH.allows(sample),
                IfMatch::parse(sample.as_bytes()).is_some(),
                "If-Match {sample:?}"
            );
        }
    }
}
