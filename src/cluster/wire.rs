//! The ResourceSlice fields `usage` and `why` read, parsed lean: 200 nodes of 8 H100s publish
//! about 40 MB of slices, and k8s-openapi's full types took twice as long to parse and as long
//! again to free. Field names are the API's; fields not listed here are skipped.
//!
//! The same fields in the API server's protobuf encoding, which it writes in about half the time
//! of JSON, and smaller ([`protobuf`]): k8s-openapi and kube have JSON only.

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A page of a list: its items and the token to the next page.
#[derive(Debug, Deserialize)]
pub struct List<T> {
    #[serde(default)]
    pub metadata: ListMeta,
    pub items: Vec<T>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "continue")]
    pub continue_: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Slice {
    pub spec: SliceSpec,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    pub driver: String,
    pub pool: Pool,
    #[serde(default)]
    pub shared_counters: Vec<CounterSet>,
    #[serde(default)]
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Pool {
    pub name: String,
    pub generation: i64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: BTreeMap<String, Value>,
}

/// `{"value": "9856Mi"}`: a counter or a capacity.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Value {
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
    #[serde(default)]
    pub capacity: BTreeMap<String, Value>,
    #[serde(default)]
    pub consumes_counters: Vec<Consumption>,
    #[serde(default)]
    pub taints: Vec<Taint>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumption {
    pub counter_set: String,
    pub counters: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
}

/// One attribute value; the list kinds (`ints`, `strings`, …) are kept as `Other`, which no
/// selector here evaluates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    Int(i64),
    Bool(bool),
    String(String),
    Version(String),
    Other,
}

impl<'de> Deserialize<'de> for Attribute {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct One;
        impl<'de> Visitor<'de> for One {
            type Value = Attribute;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a device attribute ({\"int\": 1}, {\"string\": \"x\"}, …)")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Attribute, A::Error> {
                let mut out = Attribute::Other;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    out = match &*key {
                        "int" => Attribute::Int(map.next_value()?),
                        "bool" => Attribute::Bool(map.next_value()?),
                        "string" => Attribute::String(map.next_value()?),
                        "version" => Attribute::Version(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            out
                        }
                    };
                }
                Ok(out)
            }
        }
        d.deserialize_map(One)
    }
}

/// The API server's protobuf encoding of a list of ResourceSlices, read into the same types as
/// the JSON: field numbers from `k8s.io/api/resource/v1/generated.proto` (and apimachinery's for
/// the list, the quantity and the envelope); fields not declared are skipped, as in the JSON.
pub mod protobuf {
    use prost::Message;
    use prost::bytes::Bytes;
    use std::collections::BTreeMap;

    /// The media type to ask for in `Accept`, and the one such a response carries.
    pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
    /// What every protobuf response starts with, before its envelope.
    const MAGIC: &[u8] = b"k8s\0";

    /// Not the API server's protobuf: the bytes, or the envelope, are not what it sends.
    #[derive(Debug, thiserror::Error)]
    pub enum Error {
        #[error("a protobuf response must start with k8s\\0, not {0:?}")]
        Magic(Vec<u8>),
        #[error("undecodable protobuf list: {0}")]
        Decode(#[from] prost::DecodeError),
    }

    /// A page of slices: the continue token first (cheap: prost skips the items' bytes), so the
    /// next page can be asked for while [`items`] decodes this one.
    pub fn continue_token(body: &Bytes) -> Result<Option<String>, Error> {
        let list = PageMeta::decode(raw(body)?)?;
        Ok(list.metadata.and_then(|m| m.continue_).filter(|t| !t.is_empty()))
    }

    /// A page's slices.
    pub fn items(body: &Bytes) -> Result<Vec<super::Slice>, Error> {
        Ok(SliceList::decode(raw(body)?)?.items.into_iter().map(super::Slice::from).collect())
    }

    /// The list's bytes inside the envelope (`runtime.Unknown`'s `raw`), without a copy.
    fn raw(body: &Bytes) -> Result<Bytes, Error> {
        let rest = body.strip_prefix(MAGIC).ok_or_else(|| Error::Magic(body.iter().take(4).copied().collect()))?;
        Ok(Unknown::decode(body.slice(body.len() - rest.len()..))?.raw.unwrap_or_default())
    }

    #[derive(Clone, PartialEq, Message)]
    struct Unknown {
        #[prost(bytes = "bytes", optional, tag = "2")]
        raw: Option<Bytes>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct PageMeta {
        #[prost(message, optional, tag = "1")]
        metadata: Option<ListMeta>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct ListMeta {
        #[prost(string, optional, tag = "3")]
        continue_: Option<String>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct SliceList {
        #[prost(message, repeated, tag = "2")]
        items: Vec<Slice>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Slice {
        #[prost(message, optional, tag = "2")]
        spec: Option<SliceSpec>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct SliceSpec {
        #[prost(string, tag = "1")]
        driver: String,
        #[prost(message, optional, tag = "2")]
        pool: Option<Pool>,
        #[prost(message, repeated, tag = "6")]
        devices: Vec<Device>,
        #[prost(message, repeated, tag = "8")]
        shared_counters: Vec<CounterSet>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Pool {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(int64, tag = "2")]
        generation: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    struct CounterSet {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(btree_map = "string, message", tag = "2")]
        counters: BTreeMap<String, Amount>,
    }

    /// A `Counter` or a `DeviceCapacity`: both hold their quantity at 1.
    #[derive(Clone, PartialEq, Message)]
    struct Amount {
        #[prost(message, optional, tag = "1")]
        value: Option<Quantity>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Quantity {
        #[prost(string, tag = "1")]
        string: String,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Device {
        #[prost(string, tag = "1")]
        name: String,
        #[prost(btree_map = "string, message", tag = "2")]
        attributes: BTreeMap<String, Attribute>,
        #[prost(btree_map = "string, message", tag = "3")]
        capacity: BTreeMap<String, Amount>,
        #[prost(message, repeated, tag = "4")]
        consumes_counters: Vec<Consumption>,
        #[prost(message, repeated, tag = "8")]
        taints: Vec<Taint>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Attribute {
        #[prost(int64, optional, tag = "2")]
        int: Option<i64>,
        #[prost(bool, optional, tag = "3")]
        bool: Option<bool>,
        #[prost(string, optional, tag = "4")]
        string: Option<String>,
        #[prost(string, optional, tag = "5")]
        version: Option<String>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Consumption {
        #[prost(string, tag = "1")]
        counter_set: String,
        #[prost(btree_map = "string, message", tag = "2")]
        counters: BTreeMap<String, Amount>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct Taint {
        #[prost(string, tag = "1")]
        key: String,
        #[prost(string, optional, tag = "2")]
        value: Option<String>,
        #[prost(string, tag = "3")]
        effect: String,
    }

    fn amounts(m: BTreeMap<String, Amount>) -> BTreeMap<String, super::Value> {
        m.into_iter().map(|(k, a)| (k, super::Value { value: a.value.unwrap_or_default().string })).collect()
    }

    impl From<Slice> for super::Slice {
        fn from(s: Slice) -> Self {
            let spec = s.spec.unwrap_or_default();
            let pool = spec.pool.unwrap_or_default();
            Self {
                spec: super::SliceSpec {
                    driver: spec.driver,
                    pool: super::Pool { name: pool.name, generation: pool.generation },
                    shared_counters: spec
                        .shared_counters
                        .into_iter()
                        .map(|c| super::CounterSet { name: c.name, counters: amounts(c.counters) })
                        .collect(),
                    devices: spec.devices.into_iter().map(super::Device::from).collect(),
                },
            }
        }
    }

    impl From<Device> for super::Device {
        fn from(d: Device) -> Self {
            Self {
                name: d.name,
                attributes: d.attributes.into_iter().map(|(k, a)| (k, a.into())).collect(),
                capacity: amounts(d.capacity),
                consumes_counters: d
                    .consumes_counters
                    .into_iter()
                    .map(|c| super::Consumption { counter_set: c.counter_set, counters: amounts(c.counters) })
                    .collect(),
                taints: d
                    .taints
                    .into_iter()
                    .map(|t| super::Taint { key: t.key, value: t.value, effect: t.effect })
                    .collect(),
            }
        }
    }

    impl From<Attribute> for super::Attribute {
        fn from(a: Attribute) -> Self {
            match a {
                Attribute { int: Some(i), .. } => Self::Int(i),
                Attribute { bool: Some(b), .. } => Self::Bool(b),
                Attribute { string: Some(s), .. } => Self::String(s),
                Attribute { version: Some(v), .. } => Self::Version(v),
                _ => Self::Other,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The envelope as the API server writes it, around a list made here: the decoder's own
        /// round trip (tests/controlplane.rs compares it with the JSON of a real API server).
        fn page(list: &SliceList, token: &str) -> Bytes {
            #[derive(Clone, PartialEq, Message)]
            struct Whole {
                #[prost(message, optional, tag = "1")]
                metadata: Option<ListMeta>,
                #[prost(message, repeated, tag = "2")]
                items: Vec<Slice>,
            }
            let whole = Whole { metadata: Some(ListMeta { continue_: Some(token.into()) }), items: list.items.clone() };
            let envelope = Unknown { raw: Some(whole.encode_to_vec().into()) };
            [MAGIC, &envelope.encode_to_vec()].concat().into()
        }

        #[test]
        fn a_page_decodes_to_the_json_types() {
            let device = Device {
                name: "gpu-0-mig-1g10gb-9-0".into(),
                attributes: [
                    ("a".to_string(), Attribute { int: Some(0), ..Default::default() }),
                    ("b".to_string(), Attribute { string: Some("s".into()), ..Default::default() }),
                    ("c".to_string(), Attribute { version: Some("1.0.0".into()), ..Default::default() }),
                    ("d".to_string(), Attribute { bool: Some(false), ..Default::default() }),
                    ("e".to_string(), Attribute::default()),
                ]
                .into(),
                capacity: [("memory".to_string(), Amount { value: Some(Quantity { string: "40Gi".into() }) })].into(),
                consumes_counters: vec![],
                taints: vec![Taint { key: "k".into(), value: None, effect: "NoSchedule".into() }],
            };
            let list = SliceList {
                items: vec![Slice {
                    spec: Some(SliceSpec {
                        driver: "d".into(),
                        pool: Some(Pool { name: "n".into(), generation: 2 }),
                        devices: vec![device],
                        shared_counters: vec![],
                    }),
                }],
            };
            let body = page(&list, "abc");
            assert_eq!(continue_token(&body).unwrap().as_deref(), Some("abc"));
            let got = items(&body).unwrap();
            let d = &got[0].spec.devices[0];
            let a = |k: &str| d.attributes[k].clone();
            use super::super::Attribute as A;
            assert_eq!(
                [a("a"), a("b"), a("c"), a("d"), a("e")],
                [A::Int(0), A::String("s".into()), A::Version("1.0.0".into()), A::Bool(false), A::Other]
            );
            assert_eq!(d.capacity["memory"].value, "40Gi");
            assert_eq!((got[0].spec.pool.name.as_str(), got[0].spec.pool.generation), ("n", 2));
            assert_eq!(continue_token(&page(&list, "")).unwrap(), None);
        }

        #[test]
        fn json_or_garbage_is_refused_by_name() {
            let err = items(&Bytes::from_static(b"{\"items\": []}")).unwrap_err();
            assert_eq!(err.to_string(), "a protobuf response must start with k8s\\0, not [123, 34, 105, 116]");
            assert!(matches!(items(&Bytes::from_static(b"k8s\0\xff\xff")), Err(Error::Decode(_))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_api_server_sends_parses() {
        let text = r#"{"metadata":{"continue":"abc"},"items":[{"metadata":{"name":"s"},"spec":{
            "driver":"d","pool":{"name":"n","generation":2,"resourceSliceCount":1},"nodeName":"n",
            "devices":[{"name":"x","attributes":{"a":{"int":3},"b":{"string":"s"},"c":{"version":"1.0.0"},
            "d":{"bool":true},"e":{"ints":[1,2]}},"capacity":{"memory":{"value":"40Gi"}},
            "taints":[{"key":"k","effect":"NoSchedule","timeAdded":"2026-01-01T00:00:00Z"}]}]}}]}"#;
        let l: List<Slice> = serde_json::from_str(text).unwrap();
        assert_eq!(l.metadata.continue_.as_deref(), Some("abc"));
        let d = &l.items[0].spec.devices[0];
        let a = |k: &str| d.attributes[k].clone();
        assert_eq!(
            [a("a"), a("b"), a("c"), a("d"), a("e")],
            [
                Attribute::Int(3),
                Attribute::String("s".into()),
                Attribute::Version("1.0.0".into()),
                Attribute::Bool(true),
                Attribute::Other
            ]
        );
        assert_eq!(d.capacity["memory"].value, "40Gi");
        assert_eq!(d.taints, [Taint { key: "k".into(), value: None, effect: "NoSchedule".into() }]);
        assert!(l.items[0].spec.shared_counters.is_empty());
    }
}
