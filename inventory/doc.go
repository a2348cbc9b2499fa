// Package inventory owns machines (identity, facts and their history,
// lifecycle, boot intent, timeline) and, in inventory/pool, the node pool.
// It may import the api and the store contract only.
package inventory
