//! The two places where serde's derive reads more, or less, than the OpenAPI document
//! allows, as attributes on the body types (`#[serde(deserialize_with = ...)]`):
//!
//! - a struct is read from a JSON object only: the derive also reads one from an array
//!   (its fields in order), which the document does not allow ([`Object`], [`objects`]);
//! - JSON Schema's `integer` admits a number written with a zero fraction (`2.0`, `1e3`),
//!   which serde's integers refuse ([`integer`]).
//!
//! Both keep serde_path_to_error's path, so that a refusal names the field
//! (`items[0].quantity`).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Unexpected, Visitor};

/// A `T` read from a JSON object only (not from an array of its fields).
#[derive(Debug)]
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectOnly<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOnly<T> {
            type Value = T;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }

        deserializer.deserialize_map(ObjectOnly(PhantomData)).map(Object)
    }
}

/// A list of `T`, each read from a JSON object only: `#[serde(deserialize_with =
/// "strict::objects")]`.
pub fn objects<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Vec::<Object<T>>::deserialize(deserializer)?
        .into_iter()
        .map(|Object(value)| value)
        .collect())
}

/// An integer, also when written with a zero fraction (`2.0`, `1e3`) as JSON Schema's
/// `integer` allows: `#[serde(deserialize_with = "strict::integer")]`.
pub fn integer<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + TryFrom<i64>,
{
    struct Integer<T>(PhantomData<T>);

    impl<T: TryFrom<u64> + TryFrom<i64>> Visitor<'_> for Integer<T> {
        type Value = T;

        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("an integer in range")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
            T::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
            T::try_from(value).map_err(|_| E::invalid_value(Unexpected::Signed(value), &self))
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
            // 2^64 and -2^63 are exact in an f64; every integral f64 between them
            // converts exactly.
            const TWO_TO_THE_64: f64 = 18_446_744_073_709_551_616.0;
            let refused = || E::invalid_type(Unexpected::Float(value), &self);
            if value.fract() != 0.0 {
                Err(refused())
            } else if (0.0..TWO_TO_THE_64).contains(&value) {
                self.visit_u64(value as u64)
            } else if (i64::MIN as f64..0.0).contains(&value) {
                self.visit_i64(value as i64)
            } else {
                Err(refused())
            }
        }
    }

    deserializer.deserialize_any(Integer(PhantomData))
}
