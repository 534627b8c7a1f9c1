#pragma once
// CommitFault: tests only, how the COMMIT of a writing transaction is made to go wrong
// (PostgresMetadataStore::InjectCommitFaultForTesting; TransactionRunner takes one per
// transaction, Connection acts it out).

namespace minions::postgres_store {

enum class CommitFault {
  kNone,
  // The connection breaks before COMMIT is sent: the transaction rolls back.
  kConnectionLostBeforeCommit,
  // COMMIT is sent, then the connection breaks before its answer is read: the transaction
  // commits, and the store must not run it again.
  kAnswerLost,
};

}  // namespace minions::postgres_store
