//! Errors as the one-line messages every layer gives: an error and its causes, joined.

/// An error and its causes on one line: tonic's connect error alone says only "transport error",
/// while the cause (no such file, connection refused) is in its sources.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let cause = s.to_string();
        // io errors wrapped twice print the same words twice.
        if !text.ends_with(&cause) {
            text = format!("{text}: {cause}");
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn causes_join_in_order_and_a_repeated_one_is_said_once() {
        let e = Layer("transport error", Some(Box::new(Layer("connect", Some(Box::new(Layer("refused", None)))))));
        assert_eq!(with_causes(&e), "transport error: connect: refused");
        let twice = Layer("read x: refused", Some(Box::new(Layer("refused", None))));
        assert_eq!(with_causes(&twice), "read x: refused");
    }
}
