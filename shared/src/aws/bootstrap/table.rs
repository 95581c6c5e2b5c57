//! The table: created as the layout keys it, or checked when it exists (its key schema,
//! and its Regions: [`crate::aws::regions`]), with TTL on the layout's attribute.

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TimeToLiveSpecification,
    TimeToLiveStatus,
};

use super::BootstrapError;
use crate::aws::AwsClients;
use crate::ports::BoxError;
use crate::settings::TableLayout;

fn key_element(name: &str, key_type: KeyType) -> Result<(KeySchemaElement, AttributeDefinition), BoxError> {
    Ok((
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(key_type)
            .build()?,
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()?,
    ))
}

/// Creates the table as the layout keys it, or checks that the existing one fits and may
/// be written from here (`write_region`: the Region named to write it, if any); then makes
/// sure TTL is on the layout's attribute.
pub(super) async fn create_table(
    clients: &AwsClients,
    layout: &TableLayout,
    write_region: Option<&str>,
) -> Result<(), BootstrapError> {
    let table = layout.table.as_str();
    let here = clients
        .dynamodb
        .config()
        .region()
        .map(|region| region.as_ref().to_owned());
    // Made from another Region than the one named to write it, no process here could use it.
    crate::aws::regions::not_elsewhere(table, here.as_deref(), write_region)?;
    let failed = |source: BoxError| BootstrapError::Table {
        table: table.to_owned(),
        source,
    };
    let mismatch = |problem: String| BootstrapError::Mismatch {
        table: table.to_owned(),
        problem,
    };
    let mut keys = vec![key_element(&layout.partition_key, KeyType::Hash).map_err(failed)?];
    if let Some(sort_key) = &layout.sort_key {
        keys.push(key_element(&sort_key.attribute, KeyType::Range).map_err(failed)?);
    }
    let (schema, definitions): (Vec<_>, Vec<_>) = keys.into_iter().unzip();
    let result = clients
        .dynamodb
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .set_key_schema(Some(schema.clone()))
        .set_attribute_definitions(Some(definitions))
        .send()
        .await;
    match result {
        Ok(_) => {}
        Err(error)
            if matches!(
                error.as_service_error(),
                Some(CreateTableError::ResourceInUseException(_))
            ) =>
        {
            let described = clients
                .dynamodb
                .describe_table()
                .table_name(table)
                .send()
                .await
                .map_err(|e| failed(Box::new(e)))?;
            let existing: Vec<(String, KeyType)> = described
                .table()
                .map(|t| t.key_schema())
                .unwrap_or_default()
                .iter()
                .map(|key| (key.attribute_name().to_owned(), key.key_type().clone()))
                .collect();
            let wanted: Vec<(String, KeyType)> = schema
                .iter()
                .map(|key| (key.attribute_name().to_owned(), key.key_type().clone()))
                .collect();
            if existing != wanted {
                return Err(mismatch(format!(
                    "its key schema is {existing:?}, the layout names {wanted:?}"
                )));
            }
            let not_strings: Vec<&str> = described
                .table()
                .map(|t| t.attribute_definitions())
                .unwrap_or_default()
                .iter()
                .filter(|definition| wanted.iter().any(|(name, _)| name == definition.attribute_name()))
                .filter(|definition| definition.attribute_type() != &ScalarAttributeType::S)
                .map(|definition| definition.attribute_name())
                .collect();
            if !not_strings.is_empty() {
                return Err(mismatch(format!("its keys {not_strings:?} are not strings (S)")));
            }
            // A table made a global table elsewhere: refused as the processes would refuse
            // it, before TTL is touched.
            if let Some(description) = described.table() {
                crate::aws::regions::judge(table, description, here.as_deref(), write_region)?;
            }
        }
        Err(error) => return Err(failed(Box::new(error))),
    }
    let ttl = clients
        .dynamodb
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .map_err(|e| failed(Box::new(e)))?;
    let description = ttl.time_to_live_description();
    let status = description.and_then(|d| d.time_to_live_status());
    let enabled = matches!(status, Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling));
    match description.and_then(|d| d.attribute_name()) {
        Some(name) if enabled && name == layout.ttl_attribute => {}
        // A table has one TTL attribute: never move the application's own.
        Some(name) if enabled => {
            return Err(mismatch(format!(
                "its TTL is on {name:?}, the layout names {:?}",
                layout.ttl_attribute
            )))
        }
        _ => {
            clients
                .dynamodb
                .update_time_to_live()
                .table_name(table)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(&layout.ttl_attribute)
                        .enabled(true)
                        .build()
                        .map_err(|e| failed(Box::new(e)))?,
                )
                .send()
                .await
                .map_err(|e| failed(Box::new(e)))?;
        }
    }
    Ok(())
}
