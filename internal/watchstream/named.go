package watchstream

import (
	"strings"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

// Named is the watch of protobuf records stored as prefix+name: all of
// them, or only the one called name when name is set (a longer name that
// starts with it is not that one). newT makes an empty object to decode
// into; deleted makes the object sent for a deleted record from its name.
// The caller fills in FromRevision, Limiter and Logger.
func Named[T proto.Message](st store.Store, what, prefix, name string, newT func() T, deleted func(name string) T) Config[T] {
	key := prefix + name
	return Config[T]{
		Name:   what,
		Store:  st,
		Prefix: key,
		Decode: func(kv store.KV) (T, bool, error) {
			var zero T
			if name != "" && kv.Key != key {
				return zero, false, nil
			}
			v := newT()
			if err := record.Unmarshal(kv.Value, v); err != nil {
				return zero, false, err
			}
			return v, true, nil
		},
		Deleted: func(k string) (T, bool) {
			if name != "" && k != key {
				var zero T
				return zero, false
			}
			return deleted(strings.TrimPrefix(k, prefix)), true
		},
	}
}
