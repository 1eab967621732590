"""glm5next / glm5-next (GLM-5.3-Flash): KDA linear attention + NoPE MLA with the pooled DSA indexer, mHC, NextN."""
