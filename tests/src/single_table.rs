//! A table made the way a team with a single-table design makes its own: string `PK` and
//! `SK`, a global secondary index on `GSI1PK` + `GSI1SK`, TTL on `ttl`. Not through the
//! outbox library: the library has to fit it, not the other way round.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, TimeToLiveSpecification,
};
use outbox::aws::{SortKeyValue, TableLayout};

fn key(name: &str, key_type: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .expect("complete key element")
}

fn string(name: &str) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("complete attribute definition")
}

/// Creates the table `name` with its index and TTL.
pub async fn create_single_table(dynamodb: &aws_sdk_dynamodb::Client, name: &str) {
    let index = GlobalSecondaryIndex::builder()
        .index_name("GSI1")
        .key_schema(key("GSI1PK", KeyType::Hash))
        .key_schema(key("GSI1SK", KeyType::Range))
        .projection(Projection::builder().projection_type(ProjectionType::All).build())
        .build()
        .expect("complete index");
    dynamodb
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key("PK", KeyType::Hash))
        .key_schema(key("SK", KeyType::Range))
        .attribute_definitions(string("PK"))
        .attribute_definitions(string("SK"))
        .attribute_definitions(string("GSI1PK"))
        .attribute_definitions(string("GSI1SK"))
        .global_secondary_indexes(index)
        .send()
        .await
        .expect("create the single table");
    dynamodb
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .attribute_name("ttl")
                .enabled(true)
                .build()
                .expect("complete TTL specification"),
        )
        .send()
        .await
        .expect("enable TTL on the single table");
}

/// The outbox's layout on such a table: records keyed `PK = SK = TXN#…`, TTL on `ttl`.
pub fn single_table_layout(name: &str) -> TableLayout {
    TableLayout::dedicated(name)
        .with_partition_key("PK")
        .with_sort_key("SK", SortKeyValue::SameAsPartitionKey)
        .with_ttl_attribute("ttl")
}
