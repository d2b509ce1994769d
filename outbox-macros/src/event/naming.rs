//! Defaults derived from names. Shared by the derive and the catalogue, so both agree on what an
//! event is called without the user repeating it.

use heck::ToSnakeCase;
use syn::Ident;

/// The default event name: the type name in snake_case (`OrderConfirmed` -> `order_confirmed`).
pub(crate) fn default_event_name(ident: &Ident) -> String {
    ident.to_string().to_snake_case()
}

/// The default aggregate type when the event has an aggregate id and no `aggregate = "..."`:
/// the id field's name without its `_id` suffix (`order_id` -> `order`); for a field that is not
/// called `<something>_id`, the event name up to its first `.` (`order.confirmed` -> `order`),
/// or the whole event name.
pub(crate) fn default_aggregate_type(id_field: &Ident, event_name: &str) -> String {
    let field = id_field.to_string();
    let field = field.strip_prefix("r#").unwrap_or(&field);
    match field.strip_suffix("_id") {
        Some(prefix) if !prefix.is_empty() => prefix.to_owned(),
        _ => event_name
            .split('.')
            .next()
            .unwrap_or(event_name)
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::format_ident;

    #[test]
    fn event_names_default_to_snake_case() {
        assert_eq!(
            default_event_name(&format_ident!("OrderConfirmed")),
            "order_confirmed"
        );
        assert_eq!(
            default_event_name(&format_ident!("HTTPRequestSent")),
            "http_request_sent"
        );
    }

    #[test]
    fn aggregate_type_comes_from_the_id_field_then_the_name() {
        assert_eq!(
            default_aggregate_type(&format_ident!("order_id"), "order_confirmed"),
            "order"
        );
        assert_eq!(
            default_aggregate_type(&format_ident!("id"), "invoice.paid"),
            "invoice"
        );
        assert_eq!(
            default_aggregate_type(&format_ident!("id"), "invoice_paid"),
            "invoice_paid"
        );
    }
}
