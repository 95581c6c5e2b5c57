//! Where the protocol's table is replicated, and whether this process may write it: one
//! `DescribeTable` at start-up, read against the process's Region and
//! `OUTBOX_WRITE_REGION`.
//!
//! The protocol rests on conditional writes that DynamoDB evaluates against one copy of
//! each item: a tombstone record refuses a late commit, a fence mark refuses a late
//! commit in entity form, a version refuses a stale change. A global table with
//! multi-Region eventual consistency (MREC, the default mode) evaluates a condition
//! against the replica of the Region that takes the write, and settles writes to one item
//! in two Regions by the last writer winning: a tombstone or a fence written in one Region
//! does not stop a late commit in another. So a table with replicas in other Regions is
//! refused unless the operator names the one Region that writes it
//! ([`vars::WRITE_REGION`]) and this process runs there; the other Regions' replicas are
//! then copies for reading. A global table with multi-Region strong consistency (MRSC)
//! takes no transactions and no TTL, which the outbox writes with (the transactional
//! commit, the fence, an entity's delete) and expires by: it is refused whatever is set.
//!
//! The check sees the replicas that `DescribeTable` lists, which is how global tables of
//! the current version (2019.11.21) show them. A global table of the legacy version
//! (2017.11.29) lists its replicas only to `DescribeGlobalTable`, which is not called:
//! the guide says not to use one.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{MultiRegionConsistency, TableDescription};

use crate::ports::BoxError;
use crate::settings::vars;

/// The IAM action the check calls, which every process on the AWS backend needs.
pub const DESCRIBE_TABLE_ACTION: &str = "dynamodb:DescribeTable";

/// What the table's description says about its Regions, once accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableRegions {
    /// The table is in this process's Region alone: every write meets the one copy of
    /// its item.
    Single,
    /// The table has replicas in `replicas` (eventually consistent), and only this
    /// process's Region, `write_region`, writes it.
    WrittenInOneRegion {
        /// The Region that writes the table: this process's.
        write_region: String,
        /// The other Regions' replicas, for reading.
        replicas: Vec<String>,
    },
}

/// Why the table is refused, or could not be looked at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// The table has replicas in other Regions and no Region is named to write it.
    #[error(
        "table {table} is a global table with replicas in {} besides this process's Region ({}): a tombstone or fence \
         written in one Region does not stop a late commit in another (the last writer wins across Regions), so the \
         outbox refuses it; set {} to the one Region whose processes write the table and run every process that \
         writes it (the API, the control worker, the consumers) there, or use a table in one Region",
        .replicas.join(", "), .here.as_deref().unwrap_or("unknown"), vars::WRITE_REGION
    )]
    Replicated {
        /// The table.
        table: String,
        /// This process's Region.
        here: Option<String>,
        /// The other Regions with a replica.
        replicas: Vec<String>,
    },
    /// A Region is named to write the table, and this process runs in another.
    #[error(
        "{} names {write_region} as the one Region that writes table {table}, but this process runs in {}: it must not \
         write the table; run it in {write_region}, or correct {}",
        vars::WRITE_REGION, .here.as_deref().unwrap_or("no Region (AWS_REGION is unset)"), vars::WRITE_REGION
    )]
    NotTheWriteRegion {
        /// The table.
        table: String,
        /// The Region named to write it.
        write_region: String,
        /// This process's Region.
        here: Option<String>,
    },
    /// The table is a global table with multi-Region strong consistency.
    #[error(
        "table {table} is a global table with multi-Region strong consistency (replicas in {}): such a table takes no \
         transactions and no TTL, which the outbox writes with (the transactional commit, the fence, an entity's \
         delete) and expires its records by, so the outbox refuses it whatever {} says; use a table in one Region",
        .replicas.join(", "), vars::WRITE_REGION
    )]
    StronglyConsistent {
        /// The table.
        table: String,
        /// The Regions with a replica, this one's included where listed.
        replicas: Vec<String>,
    },
    /// No table of that name in this process's Region.
    #[error("table {table} does not exist in {}", .here.as_deref().unwrap_or("this process's Region"))]
    NotFound {
        /// The table.
        table: String,
        /// This process's Region.
        here: Option<String>,
    },
    /// The process may not describe the table.
    #[error(
        "this process may not read table {table}'s description: grant its role {} on the table (the outbox reads it \
         once at start-up, to refuse a table replicated to other Regions)",
        DESCRIBE_TABLE_ACTION
    )]
    NotPermitted {
        /// The table.
        table: String,
        /// DynamoDB's refusal.
        #[source]
        source: BoxError,
    },
    /// Describing the table failed otherwise (the network, throttling).
    #[error("reading table {table}'s description failed")]
    Describe {
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// Reads table `table`'s description with `client` and judges it ([`judge`]) for a
/// process in the client's Region, with `write_region` the Region named to write it.
/// A process named out of its Region is refused before any call.
pub async fn check_table_regions(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    write_region: Option<&str>,
) -> Result<TableRegions, RegionError> {
    let here = client.config().region().map(|region| region.as_ref().to_owned());
    not_elsewhere(table, here.as_deref(), write_region)?;
    let described = client.describe_table().table_name(table).send().await;
    let described = match described {
        Ok(output) => output,
        Err(error) => return Err(describe_failed(table, here, error)),
    };
    let Some(description) = described.table() else {
        return Err(RegionError::Describe {
            table: table.to_owned(),
            source: "DynamoDB answered DescribeTable without the table's description".into(),
        });
    };
    let judged = judge(table, description, here.as_deref(), write_region)?;
    if let TableRegions::WrittenInOneRegion { write_region, replicas } = &judged {
        tracing::info!(
            table,
            write_region = %write_region,
            replicas = %replicas.join(","),
            "a global table written from this Region alone; the other Regions' replicas are for reading"
        );
    }
    Ok(judged)
}

/// Why `DescribeTable` of `table` failed, for an operator: no such table in Region `here`,
/// no permission (naming the action to grant), or anything else.
fn describe_failed<R>(table: &str, here: Option<String>, error: SdkError<DescribeTableError, R>) -> RegionError
where
    R: std::fmt::Debug + Send + Sync + 'static,
{
    if let Some(DescribeTableError::ResourceNotFoundException(_)) = error.as_service_error() {
        return RegionError::NotFound {
            table: table.to_owned(),
            here,
        };
    }
    if error.code() == Some("AccessDeniedException") {
        return RegionError::NotPermitted {
            table: table.to_owned(),
            source: Box::new(error),
        };
    }
    RegionError::Describe {
        table: table.to_owned(),
        source: Box::new(error),
    }
}

/// A process outside the Region named to write the table must not write it.
pub(crate) fn not_elsewhere(table: &str, here: Option<&str>, write_region: Option<&str>) -> Result<(), RegionError> {
    match write_region {
        Some(write_region) if here != Some(write_region) => Err(RegionError::NotTheWriteRegion {
            table: table.to_owned(),
            write_region: write_region.to_owned(),
            here: here.map(str::to_owned),
        }),
        _ => Ok(()),
    }
}

/// Table `table`, as `description` (`DescribeTable`'s, in Region `here`) shows it, for a
/// process in `here` with `write_region` named to write it: in one Region, or replicated
/// with eventual consistency and written from `here` alone; anything else is refused.
pub fn judge(
    table: &str,
    description: &TableDescription,
    here: Option<&str>,
    write_region: Option<&str>,
) -> Result<TableRegions, RegionError> {
    not_elsewhere(table, here, write_region)?;
    let listed: Vec<String> = description
        .replicas()
        .iter()
        .filter_map(|replica| replica.region_name())
        .map(str::to_owned)
        .collect();
    // Strong consistency refuses whatever is named: no transactions, no TTL there.
    if description.multi_region_consistency() == Some(&MultiRegionConsistency::Strong) {
        let mut replicas = listed;
        replicas.sort();
        replicas.dedup();
        return Err(RegionError::StronglyConsistent {
            table: table.to_owned(),
            replicas,
        });
    }
    // The description may list this Region's own replica beside the others: only the
    // others count.
    let mut replicas: Vec<String> = listed
        .into_iter()
        .filter(|region| Some(region.as_str()) != here)
        .collect();
    replicas.sort();
    replicas.dedup();
    if replicas.is_empty() {
        return Ok(TableRegions::Single);
    }
    match write_region {
        None => Err(RegionError::Replicated {
            table: table.to_owned(),
            here: here.map(str::to_owned),
            replicas,
        }),
        Some(write_region) => Ok(TableRegions::WrittenInOneRegion {
            write_region: write_region.to_owned(),
            replicas,
        }),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{ReplicaDescription, ReplicaStatus};

    use super::*;

    fn replica(region: &str) -> ReplicaDescription {
        ReplicaDescription::builder()
            .region_name(region)
            .replica_status(ReplicaStatus::Active)
            .build()
    }

    fn global(regions: &[&str]) -> TableDescription {
        regions
            .iter()
            .fold(
                TableDescription::builder()
                    .table_name("orders")
                    .global_table_version("2019.11.21"),
                |builder, region| builder.replicas(replica(region)),
            )
            .build()
    }

    #[test]
    fn a_table_in_one_region_is_accepted_with_or_without_a_write_region() {
        let single = TableDescription::builder().table_name("orders").build();
        assert_eq!(
            judge("orders", &single, Some("us-east-1"), None).unwrap(),
            TableRegions::Single
        );
        assert_eq!(
            judge("orders", &single, Some("us-east-1"), Some("us-east-1")).unwrap(),
            TableRegions::Single
        );
        // A description that lists only this Region's own replica.
        assert_eq!(
            judge("orders", &global(&["us-east-1"]), Some("us-east-1"), None).unwrap(),
            TableRegions::Single
        );
    }

    #[test]
    fn replicas_in_other_regions_are_refused_unless_this_region_is_named_to_write() {
        let table = global(&["eu-west-1", "us-east-1", "ap-south-1"]);
        let refused = judge("orders", &table, Some("us-east-1"), None).unwrap_err();
        let RegionError::Replicated { replicas, here, .. } = &refused else {
            panic!("{refused:?}")
        };
        assert_eq!(replicas, &["ap-south-1", "eu-west-1"]);
        assert_eq!(here.as_deref(), Some("us-east-1"));
        let told = refused.to_string();
        assert!(
            told.contains("table orders")
                && told.contains("ap-south-1, eu-west-1")
                && told.contains(vars::WRITE_REGION),
            "{told}"
        );
        assert_eq!(
            judge("orders", &table, Some("us-east-1"), Some("us-east-1")).unwrap(),
            TableRegions::WrittenInOneRegion {
                write_region: "us-east-1".to_owned(),
                replicas: vec!["ap-south-1".to_owned(), "eu-west-1".to_owned()],
            }
        );
    }

    #[test]
    fn a_process_outside_the_write_region_is_refused_replicated_or_not() {
        for table in [
            global(&["eu-west-1"]),
            TableDescription::builder().table_name("orders").build(),
        ] {
            let refused = judge("orders", &table, Some("eu-west-1"), Some("us-east-1")).unwrap_err();
            assert!(
                matches!(&refused, RegionError::NotTheWriteRegion { write_region, here, .. }
                    if write_region == "us-east-1" && here.as_deref() == Some("eu-west-1")),
                "{refused:?}"
            );
            assert!(refused.to_string().contains("must not write"), "{refused}");
        }
        assert!(matches!(
            judge("orders", &global(&["eu-west-1"]), None, Some("us-east-1")),
            Err(RegionError::NotTheWriteRegion { here: None, .. })
        ));
    }

    /// A description refused for want of permission says which action to grant; a table
    /// that is not there says so; anything else is passed on.
    #[test]
    fn a_description_that_failed_says_what_to_do() {
        use aws_sdk_dynamodb::error::ErrorMetadata;
        use aws_sdk_dynamodb::types::error::ResourceNotFoundException;
        let failed = |error: DescribeTableError| {
            describe_failed("orders", Some("us-east-1".into()), SdkError::service_error(error, ()))
        };
        let denied = failed(DescribeTableError::generic(
            ErrorMetadata::builder()
                .code("AccessDeniedException")
                .message("not authorized to perform: dynamodb:DescribeTable")
                .build(),
        ));
        assert!(matches!(denied, RegionError::NotPermitted { .. }), "{denied:?}");
        assert!(denied.to_string().contains(DESCRIBE_TABLE_ACTION), "{denied}");
        let missing = failed(DescribeTableError::ResourceNotFoundException(
            ResourceNotFoundException::builder().build(),
        ));
        assert_eq!(missing.to_string(), "table orders does not exist in us-east-1");
        let throttled = failed(DescribeTableError::generic(
            ErrorMetadata::builder().code("ThrottlingException").build(),
        ));
        assert!(matches!(throttled, RegionError::Describe { .. }), "{throttled:?}");
    }

    #[test]
    fn strong_consistency_is_refused_whatever_is_named() {
        let table = TableDescription::builder()
            .table_name("orders")
            .multi_region_consistency(MultiRegionConsistency::Strong)
            .replicas(replica("us-east-2"))
            .replicas(replica("us-east-1"))
            .build();
        for write_region in [None, Some("us-east-1")] {
            let refused = judge("orders", &table, Some("us-east-1"), write_region).unwrap_err();
            let RegionError::StronglyConsistent { replicas, .. } = &refused else {
                panic!("{refused:?}")
            };
            assert_eq!(replicas, &["us-east-1", "us-east-2"]);
            assert!(refused.to_string().contains("no transactions and no TTL"), "{refused}");
        }
        // Eventual consistency said outright is the default mode, judged by its replicas.
        let eventual = TableDescription::builder()
            .table_name("orders")
            .multi_region_consistency(MultiRegionConsistency::Eventual)
            .replicas(replica("us-east-2"))
            .build();
        assert!(matches!(
            judge("orders", &eventual, Some("us-east-1"), None),
            Err(RegionError::Replicated { .. })
        ));
    }
}
