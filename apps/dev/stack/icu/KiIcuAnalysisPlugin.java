/*
 * The ICU analysis components of the native local stack (`ki stack up` compiles this file into the
 * `ki-analysis-icu` module, see apps/stack/artifacts.py).
 *
 * OpenSearch's own `analysis-icu` plugin is not served by the Maven registry the stack resolves from
 * (only the Lucene ICU module and ICU4J are), so this module registers the same names with the same
 * main parameters on top of Lucene's ICU classes:
 *
 *   char_filter  icu_normalizer  name: nfc | nfkc | nfkc_cf (default), mode: compose (default) | decompose,
 *                                unicode_set_filter
 *   filter       icu_normalizer  name, unicode_set_filter
 *   filter       icu_folding     unicode_set_filter
 *   tokenizer    icu_tokenizer   (default rule set)
 *
 * Index definitions written against these names work unchanged on a server with the official plugin
 * (docker-compose.yml installs that one).
 */
package ki.analysis.icu;

import com.ibm.icu.text.FilteredNormalizer2;
import com.ibm.icu.text.Normalizer2;
import com.ibm.icu.text.UnicodeSet;
import java.io.Reader;
import java.util.Map;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.icu.ICUFoldingFilter;
import org.apache.lucene.analysis.icu.ICUNormalizer2CharFilter;
import org.apache.lucene.analysis.icu.ICUNormalizer2Filter;
import org.apache.lucene.analysis.icu.segmentation.ICUTokenizer;
import org.opensearch.common.settings.Settings;
import org.opensearch.index.IndexSettings;
import org.opensearch.index.analysis.AbstractCharFilterFactory;
import org.opensearch.index.analysis.AbstractTokenFilterFactory;
import org.opensearch.index.analysis.AbstractTokenizerFactory;
import org.opensearch.index.analysis.CharFilterFactory;
import org.opensearch.index.analysis.NormalizingCharFilterFactory;
import org.opensearch.index.analysis.NormalizingTokenFilterFactory;
import org.opensearch.index.analysis.TokenFilterFactory;
import org.opensearch.index.analysis.TokenizerFactory;
import org.opensearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.opensearch.plugins.AnalysisPlugin;
import org.opensearch.plugins.Plugin;

public class KiIcuAnalysisPlugin extends Plugin implements AnalysisPlugin {

    static Normalizer2 normalizer(Settings settings, Normalizer2 fallback) {
        String name = settings.get("name");
        Normalizer2 base = fallback;
        if (name != null) {
            String mode = settings.get("mode", "compose");
            if (!mode.equals("compose") && !mode.equals("decompose")) {
                throw new IllegalArgumentException("icu_normalizer: mode must be compose or decompose, got " + mode);
            }
            base = Normalizer2.getInstance(
                null, name, mode.equals("compose") ? Normalizer2.Mode.COMPOSE : Normalizer2.Mode.DECOMPOSE);
        }
        return filtered(base, settings);
    }

    static Normalizer2 filtered(Normalizer2 base, Settings settings) {
        String filter = settings.get("unicode_set_filter");
        if (filter == null) {
            return base;
        }
        UnicodeSet set = new UnicodeSet(filter);
        set.freeze();
        return new FilteredNormalizer2(base, set);
    }

    static final class NormalizerCharFilter extends AbstractCharFilterFactory implements NormalizingCharFilterFactory {
        private final Normalizer2 normalizer;

        NormalizerCharFilter(IndexSettings indexSettings, String name, Settings settings) {
            super(indexSettings, name);
            this.normalizer = normalizer(settings, Normalizer2.getNFKCCasefoldInstance());
        }

        @Override
        public Reader create(Reader reader) {
            return new ICUNormalizer2CharFilter(reader, normalizer);
        }
    }

    static final class NormalizerFilter extends AbstractTokenFilterFactory implements NormalizingTokenFilterFactory {
        private final Normalizer2 normalizer;

        NormalizerFilter(IndexSettings indexSettings, String name, Settings settings) {
            super(indexSettings, name, settings);
            this.normalizer = normalizer(settings, Normalizer2.getNFKCCasefoldInstance());
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new ICUNormalizer2Filter(stream, normalizer);
        }
    }

    static final class FoldingFilter extends AbstractTokenFilterFactory implements NormalizingTokenFilterFactory {
        private final Normalizer2 normalizer;

        FoldingFilter(IndexSettings indexSettings, String name, Settings settings) {
            super(indexSettings, name, settings);
            this.normalizer = filtered(ICUFoldingFilter.NORMALIZER, settings);
        }

        @Override
        public TokenStream create(TokenStream stream) {
            return new ICUNormalizer2Filter(stream, normalizer);
        }
    }

    static final class IcuTokenizerFactory extends AbstractTokenizerFactory {
        IcuTokenizerFactory(IndexSettings indexSettings, String name, Settings settings) {
            super(indexSettings, settings, name);
        }

        @Override
        public Tokenizer create() {
            return new ICUTokenizer();
        }
    }

    @Override
    public Map<String, AnalysisProvider<CharFilterFactory>> getCharFilters() {
        return Map.of("icu_normalizer", (is, env, name, settings) -> new NormalizerCharFilter(is, name, settings));
    }

    @Override
    public Map<String, AnalysisProvider<TokenFilterFactory>> getTokenFilters() {
        return Map.of(
            "icu_normalizer", (is, env, name, settings) -> new NormalizerFilter(is, name, settings),
            "icu_folding", (is, env, name, settings) -> new FoldingFilter(is, name, settings)
        );
    }

    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of("icu_tokenizer", (is, env, name, settings) -> new IcuTokenizerFactory(is, name, settings));
    }
}
