//! The ResourceSlice fields `usage` and `why` read, parsed lean: 200 nodes of 8 H100s publish
//! about 40 MB of slices, and k8s-openapi's full types took twice as long to parse and as long
//! again to free. Field names are the API's; fields not listed here are skipped.

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

#[derive(Debug, Clone, Deserialize)]
pub struct Slice {
    pub spec: SliceSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    pub driver: String,
    pub pool: Pool,
    #[serde(default)]
    pub shared_counters: Vec<CounterSet>,
    #[serde(default)]
    pub devices: Vec<Device>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Pool {
    pub name: String,
    pub generation: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CounterSet {
    pub name: String,
    pub counters: BTreeMap<String, Value>,
}

/// `{"value": "9856Mi"}`: a counter or a capacity.
#[derive(Debug, Clone, Deserialize)]
pub struct Value {
    pub value: String,
}

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
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
