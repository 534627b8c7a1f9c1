#pragma once
// Every store contract suite, for a backend's test file to instantiate at once:
//
//   MINIONS_INSTANTIATE_STORE_CONTRACTS(Sqlite, ::testing::Values(StoreFactory(...), ...), Namer);
//
// instantiates MetadataStoreContract, FairShare, Placement, IdentityStoreContract,
// ModelStoreContract and GangStoreContract with the same factories (each makes a fresh, empty
// store with default StoreOptions) and test-name generator.

#include "fair_share_contract.h"
#include "gang_store_contract.h"
#include "identity_store_contract.h"
#include "metadata_store_contract.h"
#include "model_store_contract.h"

#define MINIONS_INSTANTIATE_STORE_CONTRACTS(prefix, factories, namer)               \
  INSTANTIATE_TEST_SUITE_P(prefix, MetadataStoreContract, factories, namer);        \
  INSTANTIATE_TEST_SUITE_P(prefix, FairShare, factories, namer);                    \
  INSTANTIATE_TEST_SUITE_P(prefix, Placement, factories, namer);                    \
  INSTANTIATE_TEST_SUITE_P(prefix, IdentityStoreContract, factories, namer);        \
  INSTANTIATE_TEST_SUITE_P(prefix, ModelStoreContract, factories, namer);           \
  INSTANTIATE_TEST_SUITE_P(prefix, GangStoreContract, factories, namer)
