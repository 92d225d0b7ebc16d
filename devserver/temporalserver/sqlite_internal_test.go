package temporalserver

import (
	"testing"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
)

func TestMapSearchAttributes(t *testing.T) {
	keyword, integer := enumspb.INDEXED_VALUE_TYPE_KEYWORD, enumspb.INDEXED_VALUE_TYPE_INT

	added, err := mapSearchAttributes(nil, map[string]enumspb.IndexedValueType{"B": keyword, "A": keyword, "N": integer})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"Keyword01": "A", "Keyword02": "B", "Int01": "N"}, added)

	// Already mapped names are left alone; new ones take the next free column.
	existing := map[string]string{"Keyword01": "A", "Keyword02": "B"}
	added, err = mapSearchAttributes(existing, map[string]enumspb.IndexedValueType{"A": keyword, "C": keyword})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"Keyword03": "C"}, added)

	_, err = mapSearchAttributes(existing, map[string]enumspb.IndexedValueType{"A": integer})
	require.ErrorContains(t, err, `search attribute "A" is registered as Keyword, not Int`)

	many := map[string]enumspb.IndexedValueType{}
	for i := range 1000 {
		many[string(rune('a'+i%26))+string(rune('a'+i/26))] = enumspb.INDEXED_VALUE_TYPE_BOOL
	}
	_, err = mapSearchAttributes(nil, many)
	require.ErrorContains(t, err, "no free column left")
}
