package temporalserver

import (
	"context"
	"crypto/rand"
	stdsql "database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/persistence/serialization"
	"go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/resolver"
	"go.temporal.io/server/common/searchattribute/sadefs"
	sqliteschema "go.temporal.io/server/schema/sqlite"
)

// sqliteConfig returns the persistence settings for dbFile, or for a fresh
// in-memory database when dbFile is "".
//
// In memory: the DSN is file:<unique name>?mode=memory&cache=shared. The
// sqlite plugin creates the schema itself when it opens such a database, and
// keeps its one connection open for the life of the process (its connection
// pool never closes), so the database survives the many logical opens and
// closes of a server's start. Each server gets a unique name, so servers in
// one process never share state.
//
// On disk: mode=rwc creates the file; the schema is applied by
// prepareDBFile when the file does not exist yet.
func sqliteConfig(dbFile string) *config.SQL {
	if dbFile == "" {
		return &config.SQL{
			PluginName:        sqliteplugin.PluginName,
			DatabaseName:      "temporalserver-" + rand.Text(),
			ConnectAttributes: map[string]string{"mode": "memory", "cache": "shared"},
		}
	}
	return &config.SQL{
		PluginName:        sqliteplugin.PluginName,
		DatabaseName:      dbFile,
		ConnectAttributes: map[string]string{"mode": "rwc"},
	}
}

// prepareDBFile applies the Temporal schema to a database file that does not
// exist yet. An existing file is used as is.
func prepareDBFile(cfg *config.SQL) error {
	file := cfg.DatabaseName
	if _, err := os.Stat(file); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("temporalserver: database file: %w", err)
	}
	if dir := filepath.Dir(file); dir != "" {
		if _, err := os.Stat(dir); err != nil {
			return fmt.Errorf("temporalserver: database file directory: %w", err)
		}
	}
	if err := sqliteschema.SetupSchema(cfg); err != nil {
		return fmt.Errorf("temporalserver: set up schema in %s: %w", file, err)
	}
	return nil
}

// ensureNamespace makes sure the namespace exists and that every search
// attribute in attrs is mapped to a column, writing straight to the
// database before the server starts. Doing it before start rather than
// through the API means no cache has to catch up: the server loads the
// namespace, with its search attributes, when it starts, so both are usable
// the moment Start returns.
func ensureNamespace(ctx context.Context, cfg *config.SQL, namespace string, attrs map[string]enumspb.IndexedValueType) error {
	db, err := sql.NewSQLDB(sqlplugin.DbKindMain, cfg, resolver.NewNoopResolver(), log.NewNoopLogger(), metrics.NoopMetricsHandler)
	if err != nil {
		return fmt.Errorf("temporalserver: open database: %w", err)
	}
	defer func() { _ = db.Close() }()

	rows, err := db.SelectFromNamespace(ctx, sqlplugin.NamespaceFilter{Name: &namespace})
	if err != nil && !errors.Is(err, stdsql.ErrNoRows) {
		return fmt.Errorf("temporalserver: look up namespace %q: %w", namespace, err)
	}
	if len(rows) == 0 {
		ns, err := sqliteschema.NewNamespaceConfig(clusterName, namespace, false, attrs)
		if err != nil {
			return fmt.Errorf("temporalserver: namespace %q: %w", namespace, err)
		}
		if err := sqliteschema.CreateNamespaces(cfg, ns); err != nil {
			return fmt.Errorf("temporalserver: create namespace %q: %w", namespace, err)
		}
		return nil
	}

	// The namespace was persisted by an earlier run: add what is missing.
	row := rows[0]
	serializer := serialization.NewSerializer()
	encoding, err := enumspb.EncodingTypeFromString(row.DataEncoding)
	if err != nil {
		return fmt.Errorf("temporalserver: decode namespace %q: %w", namespace, err)
	}
	detail, err := serializer.NamespaceDetailFromBlob(&commonpb.DataBlob{Data: row.Data, EncodingType: encoding})
	if err != nil {
		return fmt.Errorf("temporalserver: decode namespace %q: %w", namespace, err)
	}
	added, err := mapSearchAttributes(detail.GetConfig().GetCustomSearchAttributeAliases(), attrs)
	if err != nil {
		return fmt.Errorf("temporalserver: namespace %q: %w", namespace, err)
	}
	if len(added) == 0 {
		return nil
	}
	if detail.Config.CustomSearchAttributeAliases == nil {
		detail.Config.CustomSearchAttributeAliases = map[string]string{}
	}
	maps.Copy(detail.Config.CustomSearchAttributeAliases, added)
	blob, err := serializer.NamespaceDetailToBlob(detail)
	if err != nil {
		return fmt.Errorf("temporalserver: encode namespace %q: %w", namespace, err)
	}
	row.Data, row.DataEncoding = blob.GetData(), blob.GetEncodingType().String()
	if _, err := db.UpdateNamespace(ctx, &row); err != nil {
		return fmt.Errorf("temporalserver: update namespace %q: %w", namespace, err)
	}
	return nil
}

// mapSearchAttributes picks a free pre-allocated column (Keyword01, ...) for
// every attribute in attrs that aliases (column → name) does not map yet, and
// returns the new column → name pairs. SQL visibility has a fixed set of
// columns per type; a user-visible search attribute is an alias of one.
func mapSearchAttributes(aliases map[string]string, attrs map[string]enumspb.IndexedValueType) (map[string]string, error) {
	columns := sadefs.GetDBIndexSearchAttributes(nil).CustomSearchAttributes // column → type
	mapped := make(map[string]string, len(aliases))                          // name → column
	for column, name := range aliases {
		mapped[name] = column
	}
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names) // deterministic column choice
	free := make([]string, 0, len(columns))
	for column := range columns {
		if _, used := aliases[column]; !used {
			free = append(free, column)
		}
	}
	slices.Sort(free)

	added := map[string]string{}
	for _, name := range names {
		want := attrs[name]
		if column, ok := mapped[name]; ok {
			if have := columns[column]; have != want {
				return nil, fmt.Errorf("search attribute %q is registered as %v, not %v", name, have, want)
			}
			continue
		}
		i := slices.IndexFunc(free, func(c string) bool { return columns[c] == want })
		if i < 0 {
			return nil, fmt.Errorf("no free column left for search attribute %q of type %v", name, want)
		}
		added[free[i]] = name
		free = slices.Delete(free, i, i+1)
	}
	return added, nil
}
